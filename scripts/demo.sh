#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job: install what is missing, build, and run vhostd's engine
# benchmark (split and packed rings, batch 1/16/64). Once the blk device
# lands this boots a real Linux guest against vhostd instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh build
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
echo "vhostd virtqueue engine: in-process driver <-> device ring loop (pop+push per request)"
./build/vq-bench --requests "${REQUESTS:-2000000}"
