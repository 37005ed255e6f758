#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# rng-guest.sh: libvhostd used the way a stranger would. `meson install --destdir` puts the
# library, headers and libvhostd.pc in a scratch tree; examples/rng/rng.c is compiled there
# with nothing but `cc -Wall -Wextra -Werror examples/rng/*.c $(pkg-config --cflags --libs
# libvhostd)` (pkg-config pointed into the tree), once against the shared library (the guest
# uses split rings) and once against the static library (packed rings, checked in the features the device
# logs); each binary serves a Linux 6.1 guest (QEMU TCG, vhost-user-rng-pci) that must pick virtio_rng in /sys/class/misc/hw_random/rng_current and read 2 x 64 KiB from /dev/hwrng
# that look random (init.sh, test rng); the device must then report on SIGTERM that it served
# at least those 128 KiB. Cases: shared, static (CASES narrows them; what it leaves out is
# counted as skipped). Ends with "N passed, N failed[, N skipped]"; exit 0 only when none failed.
#
# Env: BUILD (default: the directory of VHOSTD, else build: a configured meson build
# directory), GUEST_TIMEOUT (default 240 per guest), CASES.
set -uo pipefail
SCRIPT_NAME=rng-guest
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$(dirname "${VHOSTD:-$root/build/vhostd}")}
gtimeout=${GUEST_TIMEOUT:-240}
# shellcheck disable=SC2034 # read by case_begin (lib.sh) through its name
deadline=${RNG_DEADLINE:-900}
# shellcheck source=tests/guest/lib.sh
. "$root/tests/guest/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$root/tests/common/cases.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-rng-XXXXXX")
start_all=$(date +%s)
rng_pid=""

die() {
    echo "$SCRIPT_NAME: error: $*" >&2
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
}

# stop_rng: SIGTERM (the example stops its context and prints its counters), exit status in
# $rng_status.
rng_status=0
stop_rng() {
    stop_pid "$rng_pid"
    rng_pid=""
    rng_status=$stop_status
}
trap 'stop_rng; cleanup' EXIT

[ -f "$build/build.ninja" ] || die "$build is not a meson build directory (meson setup build)"
command -v pkg-config >/dev/null || die "pkg-config not found (apt-get install pkg-config)"
"$root/tests/guest/build-guest.sh" "$root/build/guest" >"$WORK/build-guest.log" 2>&1 ||
    die "build-guest.sh failed: $(tail -n 3 "$WORK/build-guest.log")"

# ---- the installed tree --------------------------------------------------------------------
dest=$WORK/dest
meson install -C "$build" --destdir "$dest" --quiet >"$WORK/install.log" 2>&1 ||
    die "meson install failed: $(tail -n 5 "$WORK/install.log")"
pcfile=$(find "$dest" -name libvhostd.pc | head -n 1)
[ -n "$pcfile" ] || die "meson install did not install libvhostd.pc"
libdir=$(dirname "$(dirname "$pcfile")")
for f in include/vhostd/vhostd.h include/vhostd/custom.h; do
    [ -n "$(find "$dest" -path "*/$f")" ] || die "meson install did not install $f"
done
# The .pc file names the real prefix; PKG_CONFIG_SYSROOT_DIR points its paths into the tree.
PKG_CONFIG_PATH=$(dirname "$pcfile")
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR=$dest
echo "$SCRIPT_NAME: installed into $dest; pkg-config: $(pkg-config --cflags --libs libvhostd)"

# packed_negotiated LOG: the device's "NAME: features 0x..." line has bit 34 (RING_PACKED).
packed_negotiated() {
    local f
    f=$(sed -n 's/.*: features \(0x[0-9a-f]*\).*/\1/p' "$1" | tail -n 1)
    [ -n "$f" ] && [ $(((f >> 34) & 1)) = 1 ]
}

# ---- one case: build the example one way, serve a guest ----------------------------------
run_case() {
    local name=$1 dir=$WORK/$1 reason="" detail="" bin sock out ring=off
    case_begin "$name" deadline || return 0
    bin=$dir/vhost-user-rng
    sock=$dir/rng.sock
    out=$dir/rng.out
    # Only the example's own sources and what pkg-config says: no -I into the source tree.
    # shellcheck disable=SC2046 # pkg-config's output is meant to be split
    if [ "$name" = static ]; then
        ring=on
        # libvhostd.a into the binary; its own dependencies (librbd, librados: Debian ships
        # no static archives of those) stay shared libraries.
        cc -Wall -Wextra -Werror -o "$bin" "$root"/examples/rng/*.c \
            $(pkg-config --static --cflags libvhostd) \
            $(pkg-config --static --libs libvhostd |
                sed 's/-lvhostd\b/-Wl,-Bstatic -lvhostd -Wl,-Bdynamic/') >"$dir/cc.log" 2>&1 ||
            reason="cc (static libvhostd) failed: $(head -n 3 "$dir/cc.log")"
        if [ -z "$reason" ] && ldd "$bin" | grep -q libvhostd; then
            reason="the static build still loads libvhostd.so"
        fi
    else
        cc -Wall -Wextra -Werror -o "$bin" "$root"/examples/rng/*.c \
            $(pkg-config --cflags --libs libvhostd) >"$dir/cc.log" 2>&1 ||
            reason="cc failed: $(head -n 3 "$dir/cc.log")"
    fi
    if [ -z "$reason" ] && [ "$name" = shared ] &&
        ! LD_LIBRARY_PATH=$libdir ldd "$bin" | grep "$libdir/libvhostd.so" >/dev/null; then
        reason="the example does not load libvhostd.so from the installed tree"
    fi
    if [ -z "$reason" ]; then
        LD_LIBRARY_PATH=$libdir "$bin" --socket "$sock" >"$out" 2>&1 &
        rng_pid=$!
        if ! "$root/tests/guest/run-guest.sh" --no-build --guest-dir "$root/build/guest" \
            --test rng --rng-sock "$sock" --rng-dev-opts "packed=$ring" --timeout "$gtimeout" \
            --log "$dir/guest.log" \
            >"$dir/run-guest.out" 2>&1; then
            reason="guest: $(grep -E 'GUEST-RESULT|run-guest: (FAIL|error)' "$dir/run-guest.out" |
                tail -n 1)"
            sed 's/^/    /' "$dir/run-guest.out" | tail -n 20
        fi
        stop_rng
        # "rng: served N requests, B bytes, E errors in S session(s)"
        local served req bytes
        served=$(grep -E '^rng: served ' "$out" | tail -n 1)
        req=$(echo "$served" | sed -n 's/^rng: served \([0-9]*\) requests.*/\1/p')
        bytes=$(echo "$served" | sed -n 's/.* requests, \([0-9]*\) bytes.*/\1/p')
        if [ -n "$reason" ]; then
            :
        elif [ "$rng_status" != 0 ]; then
            reason="the example exited with status $rng_status on SIGTERM"
        elif [ -z "$req" ] || [ -z "$bytes" ]; then
            reason="the example printed no counters: $(tail -n 2 "$out")"
        elif [ "$req" -lt 2 ] || [ "$bytes" -lt 131072 ]; then
            reason="the example counted $req requests, $bytes bytes (the guest read 131072)"
        elif ! echo "$served" | grep -q ' 0 errors in 1 session'; then
            reason="unexpected counters: $served"
        elif [ "$ring" = on ] && ! packed_negotiated "$out"; then
            reason="the session did not negotiate VIRTIO_F_RING_PACKED: $(grep ': features 0x' "$out")"
        else
            detail="packed=$ring: $req requests, $bytes bytes served"
        fi
        [ -n "$reason" ] && sed 's/^/    rng| /' "$out" | tail -n 10
    fi
    case_end "$name" "$reason" "$detail"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" shared static
for c in shared static; do
    dir=$WORK/$c
    run_case "$c"
done
cases_summary
[ "$failed" -eq 0 ]
