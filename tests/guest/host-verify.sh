#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# host-verify.sh: the host half of the guest block tests, run on the backend's image files.
#   host-verify.sh --prepare --image IMG --seed N     before boot: stamp a known pattern at
#                                                     offset 0..1 MiB for the guest to read
#   host-verify.sh --image IMG --seed N               after the guest exited: the pattern is
#       intact, the guest's manifest + pattern (1..2 MiB) are in the image, the write-zeroes
#       region (2..4 MiB) is zero, every block of the random-write workload holds its newest
#       generation (the workload is replayed from the manifest) and nothing else was written
#   host-verify.sh --ro --image IMG --seed N          read-only disk: pattern intact and the
#       rest of the image still zero
# Options: --no-strict (image was not fresh: do not require untouched areas to be zero),
# --no-host-pattern (image was not prepared), --guest-dir DIR (where build-guest.sh put
# guest-blkcheck; env GUEST_DIR, default build/guest). The checker is the same static binary
# the guest runs, so both sides share one stamp format. Prints one HOST-CHECK line per check
# and exits 0 only if all passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
mode=host-verify
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --prepare) mode=host-prepare ;;
    --guest-dir)
        [ $# -ge 2 ] || { echo "host-verify: --guest-dir needs a value" >&2; exit 2; }
        GUEST_DIR=$2
        shift
        ;;
    -h | --help)
        sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 2
        ;;
    *) args+=("$1") ;;
    esac
    shift
done

# The binary must be the one inside the guest's initramfs (same stamp format), so it is used
# as built even if guest-blkcheck.c changed since; build-guest.sh rebuilds both together.
bin=$GUEST_DIR/guest-blkcheck
if [ ! -x "$bin" ]; then
    echo "host-verify: $bin missing; run tests/guest/build-guest.sh $GUEST_DIR" >&2
    exit 2
fi
exec "$bin" "$mode" "${args[@]}"
