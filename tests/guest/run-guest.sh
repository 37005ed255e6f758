#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# run-guest.sh: boots the test guest (Linux 6.1, busybox initramfs, TCG) against one or two
# vhost-user-blk backend sockets and runs guest-blkcheck inside it. Works with ANY backend
# that listens on a unix socket (vhostd, qemu-storage-daemon, SPDK, ...). The console goes to
# a log file; result lines are echoed live. Exits 0 only if the guest printed
# "GUEST-RESULT: PASS"; the last line printed is always "run-guest: PASS|FAIL ...".
#
# The backend must be listening before QEMU starts (QEMU is the vhost-user client); this
# script waits up to --wait-socket seconds for the socket files to appear.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

usage() {
    cat <<EOF
usage: $0 --sock PATH [options]
Disks (vda is read-write, vdb read-only):
  --sock PATH           vhost-user-blk socket of the read-write disk (env VHOSTD_SOCK)
  --ro-sock PATH        socket of a second disk exported read-only (VIRTIO_BLK_F_RO)
  --queues N            num-queues of the device (default 1)
  --ro-queues N         num-queues of the read-only device (default: --queues)
  --packed on|off       ask QEMU for a packed virtqueue (default off)
  --dev-opts STR        extra vhost-user-blk-pci properties, e.g. queue-size=256,event_idx=off
  --reconnect SECS      QEMU reconnects to a back-end that went away, every SECS seconds
                        (chardev reconnect=; default 0: a lost back-end is fatal)
Network (optional; the guest sees it as eth0):
  --net-sock PATH       vhost-user-net socket: -netdev vhost-user + virtio-net-pci
  --mac MAC             the NIC's MAC address (default 52:54:00:12:34:56)
  --net-dev-opts STR    virtio-net-pci properties (default vectors=0: QEMU 7.2 under TCG
                        segfaults in msix_set_vector_notifiers when vhost-user-net starts
                        with MSI-X; INTx works)
Entropy (optional; examples/rng, see rng-guest.sh):
  --rng-sock PATH       vhost-user-rng socket: vhost-user-rng-pci (the guest's /dev/hwrng)
  --rng-dev-opts STR    extra vhost-user-rng-pci properties
Expectations checked in the guest (omit to skip the check):
  --sectors N           capacity in 512-byte sectors       --ro-sectors N
  --serial S            serial (GET_ID) string, no spaces  --ro-serial S
  --lbs N               logical block size in bytes
  --expect-queues N     blk-mq hw queues (default min(queues, smp))
  --expect-ring R       split|packed|any (default: packed if --packed on, else split)
  --discard yes|no|any  whether the device offers discard (default any)
  --require F1,F2       virtio features that must be negotiated (e.g. EVENT_IDX,MQ)
  --forbid F1,F2        virtio features that must not be negotiated
Workload:
  --seed N              stamp seed (default random; give the same to host-verify.sh)
  --no-host-pattern     the images were not stamped with host-verify.sh --prepare
  --threads N  --work-mb N   (guest-blkcheck defaults: 4 threads, 32 MiB)
  --guest-args "..."    more guest-blkcheck arguments (space separated, no quoting)
  --test blk|boot|cmd|rng   what /init runs (default blk; cmd runs --guest-args as a shell
                        line; rng reads /dev/hwrng from --rng-sock)
VM and harness:
  --smp N (2)  --mem SIZE (512M)  --timeout SECS (env GUEST_TIMEOUT, default 180)
  --log PATH            console log (env GUEST_LOG; default a new file in \$TMPDIR)
  --guest-dir DIR       build-guest.sh output (env GUEST_DIR, default $REPO/build/guest)
  --no-build            do not run build-guest.sh first
  --wait-socket SECS    wait for socket files (default 10)
  --server              QEMU listens on the sockets (server=on,wait=off) and the back-end
                        connects (vhostd client=on); no wait for socket files
  --qemu PATH           QEMU binary (env QEMU, default qemu-system-x86_64)
  --iommu MODE          off (default), lazy or strict: q35 with an emulated Intel IOMMU
                        (device IOTLB), guest intel_iommu=on with iommu.strict=0 or 1; give
                        the devices iommu_platform=on,ats=on,disable-legacy=on in --dev-opts
  -v, --verbose         echo the whole console, not only result lines
  --interactive         boot to a shell on this terminal (no log, no checks)
EOF
    exit 2
}

SOCK=${VHOSTD_SOCK:-}
RO_SOCK=""
QUEUES=1
RO_QUEUES=""
PACKED=off
DEV_OPTS=""
RECONNECT=0
NET_SOCK=""
RNG_SOCK=""
RNG_DEV_OPTS=""
MAC=52:54:00:12:34:56
NET_DEV_OPTS=vectors=0
SECTORS=""
RO_SECTORS=""
SERIAL=""
RO_SERIAL=""
LBS=""
EXPECT_QUEUES=""
EXPECT_RING=""
DISCARD=""
REQUIRE=""
FORBID=""
SEED=""
HOST_PATTERN=1
THREADS=""
WORK_MB=""
GUEST_ARGS=""
TEST=blk
SMP=2
MEM=512M
TIMEOUT=${GUEST_TIMEOUT:-180}
LOG=${GUEST_LOG:-}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
BUILD=1
WAIT_SOCKET=10
QEMU=${QEMU:-qemu-system-x86_64}
VERBOSE=0
INTERACTIVE=0
SERVER=0
IOMMU=off

need() {
    [ $# -ge 2 ] || { echo "run-guest: $1 needs a value" >&2; usage; }
}
while [ $# -gt 0 ]; do
    case "$1" in
    --sock) need "$@"; SOCK=$2; shift ;;
    --ro-sock) need "$@"; RO_SOCK=$2; shift ;;
    --queues) need "$@"; QUEUES=$2; shift ;;
    --ro-queues) need "$@"; RO_QUEUES=$2; shift ;;
    --packed) need "$@"; PACKED=$2; shift ;;
    --dev-opts) need "$@"; DEV_OPTS=$2; shift ;;
    --reconnect) need "$@"; RECONNECT=$2; shift ;;
    --net-sock) need "$@"; NET_SOCK=$2; shift ;;
    --rng-sock) need "$@"; RNG_SOCK=$2; shift ;;
    --rng-dev-opts) need "$@"; RNG_DEV_OPTS=$2; shift ;;
    --mac) need "$@"; MAC=$2; shift ;;
    --net-dev-opts) need "$@"; NET_DEV_OPTS=$2; shift ;;
    --sectors) need "$@"; SECTORS=$2; shift ;;
    --ro-sectors) need "$@"; RO_SECTORS=$2; shift ;;
    --serial) need "$@"; SERIAL=$2; shift ;;
    --ro-serial) need "$@"; RO_SERIAL=$2; shift ;;
    --lbs) need "$@"; LBS=$2; shift ;;
    --expect-queues) need "$@"; EXPECT_QUEUES=$2; shift ;;
    --expect-ring) need "$@"; EXPECT_RING=$2; shift ;;
    --discard) need "$@"; DISCARD=$2; shift ;;
    --require) need "$@"; REQUIRE=$2; shift ;;
    --forbid) need "$@"; FORBID=$2; shift ;;
    --seed) need "$@"; SEED=$2; shift ;;
    --no-host-pattern) HOST_PATTERN=0 ;;
    --threads) need "$@"; THREADS=$2; shift ;;
    --work-mb) need "$@"; WORK_MB=$2; shift ;;
    --guest-args) need "$@"; GUEST_ARGS=$2; shift ;;
    --test) need "$@"; TEST=$2; shift ;;
    --smp) need "$@"; SMP=$2; shift ;;
    --mem) need "$@"; MEM=$2; shift ;;
    --timeout) need "$@"; TIMEOUT=$2; shift ;;
    --log) need "$@"; LOG=$2; shift ;;
    --guest-dir) need "$@"; GUEST_DIR=$2; shift ;;
    --no-build) BUILD=0 ;;
    --wait-socket) need "$@"; WAIT_SOCKET=$2; shift ;;
    --server) SERVER=1 ;;
    --qemu) need "$@"; QEMU=$2; shift ;;
    --iommu) need "$@"; IOMMU=$2; shift ;;
    -v | --verbose) VERBOSE=1 ;;
    --interactive) INTERACTIVE=1; TEST=shell ;;
    -h | --help) usage ;;
    *) echo "run-guest: unknown option '$1'" >&2; usage ;;
    esac
    shift
done

result() {
    echo "run-guest: $*"
}
die() {
    result "FAIL $*"
    exit 1
}

[ -n "$SOCK" ] || [ "$TEST" != blk ] || die "--sock is required"
case "$PACKED" in on | off) ;; *) die "--packed must be on or off" ;; esac
for n in "$QUEUES" "$SMP" "$TIMEOUT" "$WAIT_SOCKET" "$RECONNECT"; do
    [[ "$n" =~ ^[0-9]+$ ]] || die "not a number: '$n'"
done
RO_QUEUES=${RO_QUEUES:-$QUEUES}
if [ -z "$EXPECT_QUEUES" ]; then
    # virtio_blk uses min(num_queues, nr_cpu_ids) hardware queues.
    EXPECT_QUEUES=$((QUEUES < SMP ? QUEUES : SMP))
fi
RO_EXPECT_QUEUES=$((RO_QUEUES < SMP ? RO_QUEUES : SMP))
if [ -z "$EXPECT_RING" ]; then
    EXPECT_RING=$([ "$PACKED" = on ] && echo packed || echo split)
fi
if [ -z "$SEED" ]; then
    SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
fi

command -v "$QEMU" >/dev/null || die "$QEMU not found (apt-get install qemu-system-x86)"
if [ "$BUILD" = 1 ]; then
    "$HERE/build-guest.sh" "$GUEST_DIR" >/dev/null || die "build-guest.sh $GUEST_DIR failed"
fi
for f in vmlinuz initramfs.cpio.gz; do
    [ -s "$GUEST_DIR/$f" ] || die "$GUEST_DIR/$f missing (run build-guest.sh $GUEST_DIR)"
done
# Prefer the uncompressed PVH vmlinux: under TCG the bzImage's self-decompression costs seconds.
KERNEL=$GUEST_DIR/vmlinuz
[ -s "$GUEST_DIR/vmlinux" ] && KERNEL=$GUEST_DIR/vmlinux

# Wait for the backend sockets (with --server QEMU creates them: nothing to wait for).
CHR_OPTS=""
[ "$SERVER" = 1 ] && CHR_OPTS=",server=on,wait=off"
for s in ${SOCK:+"$SOCK"} ${RO_SOCK:+"$RO_SOCK"} ${NET_SOCK:+"$NET_SOCK"} ${RNG_SOCK:+"$RNG_SOCK"}; do
    [ "$SERVER" = 0 ] || break
    waited=0
    while [ ! -S "$s" ]; do
        [ "$waited" -lt $((WAIT_SOCKET * 10)) ] || die "no vhost-user socket at $s after ${WAIT_SOCKET}s"
        sleep 0.1
        waited=$((waited + 1))
    done
done

# Arguments for guest-blkcheck (no spaces inside values: /init splits on spaces).
gargs="--queues $EXPECT_QUEUES --ring $EXPECT_RING --seed $SEED"
[ -n "$SECTORS" ] && gargs+=" --sectors $SECTORS"
[ -n "$SERIAL" ] && gargs+=" --serial $SERIAL"
[ -n "$LBS" ] && gargs+=" --lbs $LBS"
[ -n "$DISCARD" ] && gargs+=" --discard $DISCARD"
[ -n "$REQUIRE" ] && gargs+=" --require $REQUIRE"
[ -n "$FORBID" ] && gargs+=" --forbid $FORBID"
[ -n "$THREADS" ] && gargs+=" --threads $THREADS"
[ -n "$WORK_MB" ] && gargs+=" --work-mb $WORK_MB"
[ "$HOST_PATTERN" = 0 ] && gargs+=" --no-host-pattern"
if [ -n "$RO_SOCK" ]; then
    gargs+=" --ro-dev vdb --ro-queues $RO_EXPECT_QUEUES"
    [ -n "$RO_SECTORS" ] && gargs+=" --ro-sectors $RO_SECTORS"
    [ -n "$RO_SERIAL" ] && gargs+=" --ro-serial $RO_SERIAL"
fi
[ "$TEST" = blk ] || gargs=""
[ -n "$GUEST_ARGS" ] && gargs+="${gargs:+ }$GUEST_ARGS"
case "$gargs" in *'"'*) die "guest arguments must not contain double quotes" ;; esac

# no_timer_check: under TCG on a loaded host the kernel's boot-time check of the IO-APIC timer
# can miss its ticks and panic ("IO-APIC + timer doesn't work!"); the check is for real hardware.
# Fixed PCI slots so that the read-write disk is always vda and the read-only one vdb.
# shellcheck disable=SC2054 # commas are QEMU option syntax
case "$IOMMU" in
off) iommu_append="" ;;
lazy) iommu_append=" intel_iommu=on iommu.strict=0" ;;
strict) iommu_append=" intel_iommu=on iommu.strict=1" ;;
*) die "--iommu: off, lazy or strict" ;;
esac
qemu_cmd=(
    "$QEMU" -accel tcg -smp "$SMP" -m "$MEM"
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -numa node,memdev=mem
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$KERNEL" -initrd "$GUEST_DIR/initramfs.cpio.gz"
    -append "console=ttyS0 loglevel=3 panic=-1 mitigations=off no_timer_check$iommu_append vhostd.test=$TEST vhostd.args=\"$gargs\""
)
# The IOMMU (device IOTLB: vhost-user back-ends get IOVAs and IOTLB messages) before any device.
[ "$IOMMU" = off ] || qemu_cmd+=(-machine q35 -device intel-iommu,intremap=off,device-iotlb=on)
# blk_slot ADDR: where a disk goes ($slot). Behind the IOMMU each disk sits alone behind a PCIe root
# port in that slot: on the root bus a virtio device is not PCI Express, so it has no ATS
# capability (ats=on does nothing), the guest never enables its device IOTLB, and QEMU 7.2 then
# forwards a lazy-mode (flush-queue) IOTLB flush to vhost-user only for the IOVAs its shadow
# page-table walk saw mapped: IOVAs mapped and unmapped between two flushes are never
# invalidated, the guest reuses them, and the back-end reads freed pages through old translations.
blk_slot() {
    if [ "$IOMMU" = off ]; then
        slot="addr=$1"
    else
        qemu_cmd+=(-device "pcie-root-port,id=rp$1,chassis=$(($1)),addr=$1")
        slot="bus=rp$1,addr=0x0"
    fi
}
if [ -n "$SOCK" ]; then
    reconnect_opt=""
    if [ "$RECONNECT" -gt 0 ]; then reconnect_opt=",reconnect=$RECONNECT"; fi
    qemu_cmd+=(-chardev "socket,id=vub0,path=$SOCK$CHR_OPTS$reconnect_opt")
    blk_slot 0x4
    qemu_cmd+=(-device "vhost-user-blk-pci,chardev=vub0,num-queues=$QUEUES,packed=$PACKED,$slot${DEV_OPTS:+,$DEV_OPTS}")
fi
if [ -n "$RO_SOCK" ]; then
    qemu_cmd+=(-chardev "socket,id=vub1,path=$RO_SOCK$CHR_OPTS")
    blk_slot 0x5
    qemu_cmd+=(-device "vhost-user-blk-pci,chardev=vub1,num-queues=$RO_QUEUES,packed=$PACKED,$slot${DEV_OPTS:+,$DEV_OPTS}")
fi
# The NIC and the entropy device likewise (blk_slot places any device).
if [ -n "$NET_SOCK" ]; then
    blk_slot 0x6
    qemu_cmd+=(-chardev "socket,id=vun0,path=$NET_SOCK$CHR_OPTS"
        -netdev "type=vhost-user,id=net0,chardev=vun0,queues=1"
        -device "virtio-net-pci,netdev=net0,mac=$MAC,$slot${NET_DEV_OPTS:+,$NET_DEV_OPTS}")
fi
if [ -n "$RNG_SOCK" ]; then
    blk_slot 0x7
    qemu_cmd+=(-chardev "socket,id=vur0,path=$RNG_SOCK$CHR_OPTS"
        -device "vhost-user-rng-pci,chardev=vur0,$slot${RNG_DEV_OPTS:+,$RNG_DEV_OPTS}")
fi

if [ "$INTERACTIVE" = 1 ]; then
    exec "${qemu_cmd[@]}" -serial mon:stdio
fi

if [ -z "$LOG" ]; then
    LOG=$(mktemp "${TMPDIR:-/tmp}/vhostd-guest.XXXXXX.log")
fi
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

echo "run-guest: sock=${SOCK:--} ro-sock=${RO_SOCK:--}${NET_SOCK:+ net-sock=$NET_SOCK} queues=$QUEUES packed=$PACKED smp=$SMP seed=$SEED timeout=${TIMEOUT}s log=$LOG"

qpid=""
tpid=""
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    # Only our own children: QEMU (through timeout) and the log follower.
    if [ -n "$qpid" ]; then kill "$qpid" 2>/dev/null || true; fi
    if [ -n "$tpid" ]; then kill "$tpid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s.%N)
# The serial console and QEMU's own messages (vhost-user errors) share the log.
timeout --kill-after=5 "$TIMEOUT" "${qemu_cmd[@]}" -chardev stdio,id=con,signal=off \
    -serial chardev:con </dev/null >>"$LOG" 2>&1 &
qpid=$!

if [ "$VERBOSE" = 1 ]; then
    filter='.'
else
    filter='^(GUEST-|CHECK |PERF |BLKCHECK-|DMESG .*(WARNING|BUG|Oops|broken)|qemu|.*vhost)'
fi
tail -n +1 -F --pid="$qpid" "$LOG" 2>/dev/null | tr -d '\r' |
    grep --line-buffered -E "$filter" | sed -u 's/^/  | /' &
tpid=$!

rc=0
wait "$qpid" || rc=$?
qpid=""
wait "$tpid" 2>/dev/null || true
tpid=""
elapsed=$(echo "$(date +%s.%N) $start" | awk '{printf "%.1f", $1 - $2}')

last=$(tr -d '\r' <"$LOG" | grep -E '^GUEST-RESULT: ' | tail -n 1 || true)
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "run-guest: last console lines:"
    tr -d '\r' <"$LOG" | tail -n 15 | sed 's/^/  | /'
    die "timeout after ${TIMEOUT}s (${elapsed}s elapsed; guest or backend hung) log=$LOG"
fi
case "$last" in
"GUEST-RESULT: PASS")
    if [ "$rc" != 0 ]; then
        die "guest passed but QEMU exited with status $rc (${elapsed}s) log=$LOG"
    fi
    result "PASS (${elapsed}s) seed=$SEED log=$LOG"
    exit 0
    ;;
"GUEST-RESULT: FAIL"*)
    die "${last#GUEST-RESULT: FAIL } (${elapsed}s) log=$LOG"
    ;;
*)
    echo "run-guest: last console lines:"
    tr -d '\r' <"$LOG" | tail -n 15 | sed 's/^/  | /'
    die "no GUEST-RESULT line (QEMU exit status $rc, ${elapsed}s) log=$LOG"
    ;;
esac
