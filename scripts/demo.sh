#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job: install what is missing, build vhostd, create a sparse disk image,
# start vhostd on it, boot a real Linux guest (QEMU, TCG) whose virtio_blk driver uses
# the disk over vhost-user with 2 queues on 2 workers, run a verified read/write workload
# in the guest, shut everything down cleanly and check the image on the host.
# Env: DEMO_QUEUES (2), DEMO_PACKED (off), DEMO_SIZE (1G).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
queues=${DEMO_QUEUES:-2}
packed=${DEMO_PACKED:-off}
size=${DEMO_SIZE:-1G}
dir=$root/build/demo
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1/6 packages and build"
bash scripts/deps.sh demo
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
echo "built build/vhostd"

say "2/6 guest kernel + initramfs (Debian's linux-image-amd64 and busybox-static, cached)"
bash tests/guest/build-guest.sh build/guest | tail -n 2

say "3/6 a fresh sparse disk image and vhostd serving it"
mkdir -p "$dir"
img=$dir/disk.img sock=$dir/vhostd.sock log=$dir/vhostd.log
rm -f "$img" "$sock"
truncate -s "$size" "$img"
seed=$((RANDOM * 32768 + RANDOM))
bash tests/guest/host-verify.sh --prepare --image "$img" --seed "$seed" >/dev/null
sectors=$(($(stat -c %s "$img") / 512))
./build/vhostd --workers 2 --blk "socket=$sock,image=$img,queues=$queues,serial=vhostd-demo" \
    >"$log" 2>&1 &
vhostd_pid=$!
trap 'kill $vhostd_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$log"; echo "vhostd did not start"; exit 1; }
sed 's/^/  vhostd | /' "$log"

say "4/6 boot Linux (qemu-system-x86_64 -accel tcg -smp 2, vhost-user-blk-pci num-queues=$queues packed=$packed)"
bash tests/guest/run-guest.sh --no-build --sock "$sock" --queues "$queues" --packed "$packed" \
    --sectors "$sectors" --serial vhostd-demo --lbs 512 --seed "$seed" \
    --require EVENT_IDX,MQ,FLUSH --log "$dir/guest-console.log"

say "5/6 stop vhostd (SIGTERM: drain, flush, remove the socket)"
kill -TERM "$vhostd_pid"
rc=0
wait "$vhostd_pid" || rc=$?
trap - EXIT
tail -n 6 "$log" | sed 's/^/  vhostd | /'
[ "$rc" -eq 0 ] || { echo "vhostd exited with $rc"; exit 1; }
[ ! -e "$sock" ] || { echo "socket $sock was not removed"; exit 1; }
echo "vhostd exited 0, socket removed"

say "6/6 what the guest wrote is in the image on the host"
bash tests/guest/host-verify.sh --image "$img" --seed "$seed"

say "done: a Linux guest used vhostd's disk ($queues queues on 2 workers); logs in build/demo/"
