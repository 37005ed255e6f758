#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# net-ab.sh - two (or more) vhostd builds side by side on one net cell:
# one-run passes of bench/net-side-by-side.sh (each with its own DPDK
# reference run), the builds alternating, ROUNDS times. A benchmark, not a
# test: it prints one line per run, build first, and checks nothing.
#
#   bench/net-ab.sh MODE RING ROUNDS VHOSTD_A VHOSTD_B [VHOSTD_C...]
#   bench/net-ab.sh txonly packed 3 /tmp/vhostd.before build/vhostd
#
# SECS (default 3) as in net-side-by-side.sh; copy each build's binary out
# of the build tree first (a rebuild replaces it).
set -uo pipefail

[ $# -ge 5 ] || { echo "usage: $0 MODE RING ROUNDS VHOSTD_A VHOSTD_B [...]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
mode=$1 ring=$2 rounds=$3
shift 3
for ((r = 1; r <= rounds; r++)); do
    for b in "$@"; do
        line=$(MODES=$mode RINGS=$ring REPS=1 SECS=${SECS:-3} VHOSTD=$b \
            "$root/bench/net-side-by-side.sh" 2>&1 | grep "^$mode ")
        echo "$b ${line:-failed}"
    done
done
