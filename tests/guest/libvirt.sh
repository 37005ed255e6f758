#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# libvirt.sh: vhostd under libvirt (9.0, Debian 12), as a cloud host would run it. A private
# libvirtd + virtlogd (no systemd) in a mount namespace of their own; vhostd --rpc serving one
# disk and one NIC (TAP in a network namespace); a TCG domain created with `virsh create` whose
# <disk type='vhostuser'> and <interface type='vhostuser'> are vhostd's. The test guest pings
# the TAP (5 of 5 replies) and runs guest-blkcheck's verified workload on vda; then the host
# adds a disk with `vhostctl add blk`, hot-plugs it with `virsh attach-device`, the guest finds
# vdb and runs the same verified workload on it; `virsh detach-device`, the guest sees vdb go,
# `vhostctl remove` (without --force: the front-end must have let go), the guest powers off,
# both images pass host-verify.sh, vhostd holds no device after the last removals and exits 0.
#
# Isolation: libvirtd reads /etc/libvirt/qemu.conf and uses /run/libvirt, /var/lib/libvirt,
# /var/cache/libvirt and /var/log/libvirt, with no option to move them; so both daemons run in
# a private mount namespace (unshare) where those directories are bind mounts of a scratch
# tree, and /etc/passwd and /etc/group are copies that add the kvm and libvirt-qemu groups and
# the libvirt-qemu user its QEMU driver resolves at start. The machine's own libvirt (if any) is
# not touched; the only trace left outside is the empty mount-point directories this script
# creates if missing (the package's standard ones; not removed: removing a directory unmounts
# whatever another namespace mounted on it, such as a concurrent run's). virsh reaches the
# private daemon by its socket path.
# Every wait is bounded; on any exit the domain is destroyed and libvirtd, virtlogd, QEMU and
# vhostd (each by its pid) are stopped.
#
# Env: VHOSTD (build/vhostd), VHOSTCTL (next to VHOSTD), GUEST_DIR (build/guest), LOG_DIR
# (build/libvirt: each run keeps its console and daemon logs in a directory of its own made
# there, run.XXXXXX, and points LOG_DIR/latest at it; nothing else in LOG_DIR is touched, so
# runs may share it), GUEST_TIMEOUT (300 s for the whole domain), CASES ("hotplug").
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
VHOSTCTL=${VHOSTCTL:-$(dirname "$VHOSTD")/vhostctl}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/libvirt}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
LIBVIRT_DEADLINE=${LIBVIRT_DEADLINE:-600}
PKGS="libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients"
IMG_SIZE=$((16 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))
# The guest's workload on each disk: 1 thread, 4 MiB area, 64 + 16 + 2 verified writes.
BLK_WORK="--queues 1 --ring split --sectors $SECTORS --threads 1 --work-mb 4 --ops-4k 64 --ops-64k 16 --ops-1m 2"

SCRIPT_NAME=libvirt
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

NS=vhostd-lv-$$
ns_made=0
dom=vhostd-lv-$$
dom_made=0
lv_pidfile=""
vl_pidfile=""
qemu_pidfile=""

say() { echo "libvirt: $*"; }

# pid_of FILE: the pid in FILE, if it names a live process.
pid_of() {
    local p
    [ -n "$1" ] && [ -s "$1" ] || return 1
    p=$(tr -dc 0-9 <"$1")
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
}

# kill_pidfile FILE: SIGTERM the process FILE names, up to 10 s, then SIGKILL (not our child:
# the daemons fork away, so no wait).
kill_pidfile() {
    local p i=0
    p=$(pid_of "$1") || return 0
    kill -TERM "$p" 2>/dev/null || true
    while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$p" 2>/dev/null || true
}

virsh_() {
    timeout --kill-after=5 60 virsh -q -c "qemu:///system?socket=$LV/run/libvirt-sock" "$@"
}

# shellcheck disable=SC2317 # invoked from the EXIT trap
lv_cleanup() {
    if [ "$dom_made" = 1 ]; then
        virsh_ destroy "$dom" >/dev/null 2>&1 || true
        dom_made=0
    fi
    # QEMU outlives libvirtd by design: stop it by the pid libvirt recorded, then the daemons.
    kill_pidfile "$qemu_pidfile"
    kill_pidfile "$lv_pidfile"
    kill_pidfile "$vl_pidfile"
    [ "$ns_made" = 1 ] && ip netns del "$NS" 2>/dev/null
    ns_made=0
    cleanup # lib.sh: vhostd, WORK
}
trap lv_cleanup EXIT

fatal() {
    echo "FAIL $SCRIPT_NAME/setup: $*"
    failed=$((failed + 1))
    cases_summary
    exit 1
}

# ---- packages and users ---------------------------------------------------------------------
[ "$(id -u)" = 0 ] || fatal "needs root (libvirtd, network namespace, TAP)"
{ [ -x "$VHOSTD" ] && [ -x "$VHOSTCTL" ]; } || fatal "$VHOSTD or $VHOSTCTL not built"
missing=()
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        { timeout 300 apt-get update -qq &&
            timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
            fatal "apt-get install ${missing[*]} failed"
    fi
fi
for t in libvirtd virtlogd virsh unshare python3; do
    command -v "$t" >/dev/null || fatal "$t not found"
done
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
[ "${PIPESTATUS[0]}" = 0 ] || fatal "build-guest.sh failed"
KERNEL=$GUEST_DIR/vmlinuz
[ -s "$GUEST_DIR/vmlinux" ] && KERNEL=$GUEST_DIR/vmlinux

# This run's own directory, absolute (the domain XML and the bind mounts name it): a console
# left from an earlier or a concurrent run cannot show its markers here.
mkdir -p "$LOG_DIR" || fatal "cannot create $LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && mktemp -d "$(pwd -P)/run.XXXXXX") || fatal "mktemp -d in $LOG_DIR failed"
ln -sfn "$(basename "$LOG_DIR")" "$(dirname "$LOG_DIR")/latest" 2>/dev/null || true
say "logs in $LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-libvirt.XXXXXX")
LV=$WORK/lv
mkdir -p "$LOG_DIR/libvirt-log" "$LV"
ln -s "$LOG_DIR/libvirt-log" "$LV/log" # libvirtd's, virtlogd's and the domain's QEMU log, kept
start_all=$(date +%s)

# ---- a private libvirtd + virtlogd ----------------------------------------------------------
# free_id FILE START: the first numeric id from START not used in FILE (passwd or group).
free_id() {
    local id=$2
    while cut -d: -f3 "$1" | grep -qx "$id"; do id=$((id + 1)); done
    echo "$id"
}

# start_libvirt: scratch config and state, the namespace, the daemons; 0 when virsh answers.
start_libvirt() {
    local d etc=$LV/etc
    mkdir -p "$etc" "$LV/run" "$LV/lib" "$LV/cache"
    # Debian's libvirt builds its QEMU driver for user/group libvirt-qemu and checks they exist
    # at start, whatever qemu.conf says; kvm is the group of /dev/kvm it looks up.
    cp /etc/passwd "$LV/passwd"
    cp /etc/group "$LV/group"
    if ! grep -q '^kvm:' "$LV/group"; then
        echo "kvm:x:$(free_id "$LV/group" 900):" >>"$LV/group"
    fi
    local gid uid
    if ! grep -q '^libvirt-qemu:' "$LV/group"; then
        gid=$(free_id "$LV/group" 64055)
        echo "libvirt-qemu:x:$gid:" >>"$LV/group"
    fi
    gid=$(grep '^libvirt-qemu:' "$LV/group" | cut -d: -f3)
    if ! grep -q '^libvirt-qemu:' "$LV/passwd"; then
        uid=$(free_id "$LV/passwd" 64055)
        echo "libvirt-qemu:x:$uid:$gid:libvirt QEMU (vhostd test):/var/lib/libvirt:/usr/sbin/nologin" >>"$LV/passwd"
    fi
    cat >"$etc/qemu.conf" <<EOF
# vhostd tests/guest/libvirt.sh: QEMU as root, no relabelling, no cgroups, no /dev namespace
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
EOF
    cat >"$etc/libvirtd.conf" <<EOF
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
EOF
    printf 'log_outputs = "3:file:/var/log/libvirt/virtlogd.log"\n' >"$etc/virtlogd.conf"
    # Every mount point must exist on the real file system; create the missing ones, empty.
    for d in /etc/libvirt /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt; do
        mkdir -p "$d" || return 1
    done
    lv_pidfile=$LV/libvirtd.pid
    vl_pidfile=$LV/virtlogd.pid
    # The daemons stay in the namespace after the shell that made it exits; so does their QEMU.
    if ! timeout 60 unshare --mount --propagation private sh -ec "
        mount --bind '$etc' /etc/libvirt
        mount --bind '$LV/run' /run/libvirt
        mount --bind '$LV/lib' /var/lib/libvirt
        mount --bind '$LV/cache' /var/cache/libvirt
        mount --bind '$LOG_DIR/libvirt-log' /var/log/libvirt
        mount --bind '$LV/passwd' /etc/passwd
        mount --bind '$LV/group' /etc/group
        virtlogd --daemon --pid-file '$vl_pidfile' --config /etc/libvirt/virtlogd.conf
        libvirtd --daemon --pid-file '$lv_pidfile' --config /etc/libvirt/libvirtd.conf
    " >"$LOG_DIR/unshare.log" 2>&1; then
        sed 's/^/   | /' "$LOG_DIR/unshare.log"
        return 1
    fi
    # libvirtd probes QEMU's capabilities before it answers: slow under TCG and load.
    local i=0
    while [ $i -lt 120 ]; do
        if virsh_ version >"$LOG_DIR/virsh-version.log" 2>&1; then
            sed 's/^/  /' "$LOG_DIR/virsh-version.log"
            return 0
        fi
        pid_of "$lv_pidfile" >/dev/null || break
        sleep 1
        i=$((i + 1))
    done
    sed 's/^/   | /' "$LOG_DIR/virsh-version.log"
    return 1
}

# ---- XML ------------------------------------------------------------------------------------
xml_escape() {
    sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g'
}

# disk_xml SOCK DEV: a vhost-user disk (the same XML for the domain and for attach-device).
disk_xml() {
    cat <<EOF
    <disk type='vhostuser' device='disk'>
      <driver name='qemu' type='raw'/>
      <source type='unix' path='$1'/>
      <target dev='$2' bus='virtio'/>
    </disk>
EOF
}

# domain_xml CMDLINE: the domain: TCG, 1 vCPU, 256 MiB of shared memfd memory, PVH kernel +
# the test initramfs, the vhostd disk and NIC, the console in a file.
domain_xml() {
    cat <<EOF
<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>$dom</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>$KERNEL</kernel>
    <initrd>$GUEST_DIR/initramfs.cpio.gz</initrd>
    <cmdline>$(xml_escape <<<"$1")</cmdline>
  </os>
  <features>
    <acpi/>
  </features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>$(command -v qemu-system-x86_64)</emulator>
$(disk_xml "$WORK/disk0.sock" vda)
    <interface type='vhostuser'>
      <mac address='52:54:00:00:02:02'/>
      <source type='unix' path='$WORK/net0.sock' mode='client'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='$LOG_DIR/console.log'/>
      <target port='0'/>
    </serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-global'/>
    <qemu:arg value='virtio-net-pci.vectors=0'/>
  </qemu:commandline>
</domain>
EOF
}

# ---- helpers --------------------------------------------------------------------------------
# console_has PATTERN: the guest's console shows a line matching PATTERN (ERE).
console_has() {
    tr -d '\r' <"$LOG_DIR/console.log" 2>/dev/null | grep -qE "$1"
}

# wait_console PATTERN SECS: until the console shows PATTERN; 1 on timeout, on the guest's
# final GUEST-RESULT line (it gave up) or when the domain is gone.
wait_console() {
    local end=$(($(date +%s) + $2))
    while [ "$(date +%s)" -lt "$end" ]; do
        console_has "$1" && return 0
        console_has '^GUEST-RESULT: ' && return 1
        virsh_ domstate "$dom" >/dev/null 2>&1 || { console_has "$1"; return; }
        sleep 1
    done
    return 1
}

# dev_json NAME FIELD: FIELD of device NAME in `vhostctl list --json` ("absent" if no such).
dev_json() {
    "$VHOSTCTL" --rpc "$WORK/rpc.sock" list --json |
        python3 -c 'import json, sys
d = [x for x in json.load(sys.stdin)["devices"] if x["name"] == sys.argv[1]]
print(str(d[0][sys.argv[2]]).lower() if d else "absent")' "$1" "$2"
}

# wait_dev NAME FIELD VALUE SECS: until dev_json NAME FIELD prints VALUE.
wait_dev() {
    local i=0
    while [ $i -lt $(($4 * 10)) ]; do
        [ "$(dev_json "$1" "$2")" = "$3" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# in_domain TARGET: the running domain's XML holds a disk with target dev TARGET.
in_domain() {
    virsh_ dumpxml "$dom" 2>/dev/null | grep -q "<target dev='$1'"
}

# ---- the case -------------------------------------------------------------------------------
case_hotplug() {
    local dir=$WORK/hotplug t0 seed reason="" seed2 i
    case_begin hotplug LIBVIRT_DEADLINE || return 0
    seed2=$((seed + 1))
    ip netns add "$NS" || { case_end hotplug "ip netns add $NS failed"; return; }
    ns_made=1
    ip -n "$NS" link set lo up
    for i in disk0 hot; do
        truncate -s "$IMG_SIZE" "$WORK/$i.img"
    done
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$WORK/disk0.img" \
        --seed "$seed" >/dev/null ||
        { case_end hotplug "host-verify --prepare disk0 failed"; return; }
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$WORK/hot.img" \
        --seed "$seed2" >/dev/null || { case_end hotplug "host-verify --prepare hot failed"; return; }

    # vhostd in the network namespace (its TAP lives there); its sockets are files, so the
    # domain's QEMU reaches them from outside it.
    ip netns exec "$NS" "$VHOSTD" --log-level info --rpc "$WORK/rpc.sock" \
        --blk "socket=$WORK/disk0.sock,image=$WORK/disk0.img,name=disk0,serial=lv-disk0" \
        --net "socket=$WORK/net0.sock,backend=tap,tap=vhdlv0,name=net0" \
        >"$LOG_DIR/vhostd.log" 2>&1 &
    vhostd_pid=$!
    i=0
    while ! ip -n "$NS" link show vhdlv0 >/dev/null 2>&1 || [ ! -S "$WORK/rpc.sock" ]; do
        if [ $i -ge 100 ] || ! kill -0 "$vhostd_pid" 2>/dev/null; then
            case_end hotplug "vhostd did not start (log $LOG_DIR/vhostd.log)"
            return
        fi
        sleep 0.1
        i=$((i + 1))
    done
    if ! ip -n "$NS" addr add 192.0.2.1/24 dev vhdlv0 || ! ip -n "$NS" link set vhdlv0 up; then
        case_end hotplug "cannot configure vhdlv0"
        return
    fi

    # The guest's part (init.sh's cmd test, one shell line, no double quotes): the NIC pings
    # the TAP 5 of 5; verified workload on vda; waits (bounded) for the hot-plugged vdb and
    # runs it there; waits for vdb to go; then for the host's word over TCP (the NIC still
    # works after the hot-plug cycle) before it powers off, so that the power-off does not race
    # the host's detach. Markers on the console pace the host.
    local g="ip addr add 192.0.2.2/24 dev eth0 && ip link set eth0 up"
    g+=" && i=0 && while [ \$i -lt 60 ] && ! ping -c 1 -W 1 192.0.2.1 >/dev/null; do i=\$((i+1)); done"
    g+=" && ping -c 5 -W 2 192.0.2.1 >/tmp/ping; grep 'packets transmitted' /tmp/ping"
    g+=" && grep -q '5 packets transmitted, 5 packets received' /tmp/ping"
    g+=" && guest-blkcheck blk --dev vda --serial lv-disk0 --seed $seed $BLK_WORK"
    g+=" && echo LV-WAIT-VDB && i=0 && while [ ! -b /dev/vdb ] && [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i+1)); done"
    g+=" && guest-blkcheck blk --dev vdb --serial lv-hot --seed $seed2 $BLK_WORK"
    g+=" && echo LV-VDB-DONE && i=0 && while [ -b /dev/vdb ] && [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i+1)); done"
    g+=" && [ ! -b /dev/vdb ] && echo LV-VDB-GONE"
    g+=" && timeout 120 nc -l -p 7000 >/tmp/bye; grep -q LV-BYE /tmp/bye && echo LV-BYE-RECEIVED"
    local cmdline="console=ttyS0 loglevel=3 panic=-1 mitigations=off no_timer_check vhostd.test=cmd vhostd.args=\"$g\""
    domain_xml "$cmdline" >"$LOG_DIR/domain.xml"
    disk_xml "$WORK/hot.sock" vdb >"$LOG_DIR/hot-disk.xml"

    local t_dom
    t_dom=$(date +%s)
    # Known before create, so that an interrupt during it still stops what it started.
    dom_made=1
    qemu_pidfile=$LV/run/qemu/$dom.pid
    if ! virsh_ create "$LOG_DIR/domain.xml" >"$LOG_DIR/virsh-create.log" 2>&1; then
        sed 's/^/   | /' "$LOG_DIR/virsh-create.log"
        case_end hotplug "virsh create failed"
        return
    fi
    say "domain $dom running; console $LOG_DIR/console.log"

    if ! wait_console '^LV-WAIT-VDB' "$GUEST_TIMEOUT"; then
        reason="the guest did not finish its NIC and vda checks"
    elif ! "$VHOSTCTL" --rpc "$WORK/rpc.sock" add blk \
        "socket=$WORK/hot.sock,image=$WORK/hot.img,name=hot,serial=lv-hot" >/dev/null; then
        reason="vhostctl add blk failed"
    elif ! virsh_ attach-device "$dom" "$LOG_DIR/hot-disk.xml" --live >"$LOG_DIR/attach.log" 2>&1; then
        reason="virsh attach-device failed: $(tail -n 1 "$LOG_DIR/attach.log")"
    elif ! wait_dev hot connected true 30; then
        reason="QEMU did not connect to the hot-plugged disk"
    elif ! wait_console '^LV-VDB-DONE' 180; then
        reason="the guest did not check the hot-plugged vdb"
    elif ! virsh_ detach-device "$dom" "$LOG_DIR/hot-disk.xml" --live >"$LOG_DIR/detach.log" 2>&1; then
        reason="virsh detach-device failed: $(tail -n 1 "$LOG_DIR/detach.log")"
    else
        # libvirt waits a few seconds for the guest's eject; it may still be pending then.
        i=0
        while in_domain vdb && [ $i -lt 60 ]; do
            sleep 1
            i=$((i + 1))
        done
        if in_domain vdb; then
            reason="vdb still in the domain 60 s after detach-device"
        elif ! wait_console '^LV-VDB-GONE' 60; then
            reason="the guest still sees vdb after detach-device"
        elif ! wait_dev hot connected false 30; then
            reason="QEMU did not close the detached disk's session"
        elif ! "$VHOSTCTL" --rpc "$WORK/rpc.sock" remove hot >/dev/null; then
            reason="vhostctl remove hot (not forced) failed"
        elif [ "$(dev_json hot name)" != absent ]; then
            reason="hot still listed after vhostctl remove"
        else
            # Tell the guest to power off (it listens once it printed LV-VDB-GONE).
            i=0
            until echo LV-BYE | ip netns exec "$NS" timeout 10 busybox nc -w 5 192.0.2.2 7000 \
                >/dev/null 2>&1; do
                i=$((i + 1))
                [ $i -lt 30 ] || { reason="cannot reach the guest's port 7000 over the NIC"; break; }
                sleep 1
            done
        fi
    fi
    # The guest powers itself off after its last check (on_poweroff: destroy).
    i=0
    while [ -z "$reason" ] && virsh_ domstate "$dom" >/dev/null 2>&1 && [ $i -lt 120 ]; do
        sleep 1
        i=$((i + 1))
    done
    if virsh_ domstate "$dom" >/dev/null 2>&1; then
        [ -n "$reason" ] || reason="the domain did not power off"
        virsh_ destroy "$dom" >/dev/null 2>&1
    fi
    dom_made=0
    local t_guest=$(($(date +%s) - t_dom))
    tr -d '\r' <"$LOG_DIR/console.log" | grep -E '^(GUEST-|LV-|CHECK .*FAIL|BLKCHECK-|DMESG .*(WARNING|BUG|Oops|broken)|[0-9]+ packets)' |
        cut -c1-160 | sed 's/^/  | /'
    if [ -z "$reason" ] && ! console_has '^GUEST-RESULT: PASS'; then
        reason="guest: $(tr -d '\r' <"$LOG_DIR/console.log" | grep -E '^GUEST-RESULT' | tail -n 1)"
    fi
    if [ -z "$reason" ]; then
        if ! "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$WORK/disk0.img" --seed "$seed" \
            >"$LOG_DIR/host-verify-disk0.log" 2>&1; then
            reason="host-verify disk0: $(grep -m1 FAIL "$LOG_DIR/host-verify-disk0.log")"
        elif ! "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$WORK/hot.img" --seed "$seed2" \
            >"$LOG_DIR/host-verify-hot.log" 2>&1; then
            reason="host-verify hot: $(grep -m1 FAIL "$LOG_DIR/host-verify-hot.log")"
        fi
    fi
    # The domain is gone: its devices must be disconnected, removable, and then nothing is left.
    if [ -z "$reason" ]; then
        if ! wait_dev disk0 connected false 30 || ! wait_dev net0 connected false 30; then
            reason="disk0 or net0 still connected after the domain ended"
        elif ! "$VHOSTCTL" --rpc "$WORK/rpc.sock" remove disk0 >/dev/null ||
            ! "$VHOSTCTL" --rpc "$WORK/rpc.sock" remove net0 >/dev/null; then
            reason="vhostctl remove disk0/net0 failed"
        elif [ "$("$VHOSTCTL" --rpc "$WORK/rpc.sock" list --json |
            python3 -c 'import json, sys; print(len(json.load(sys.stdin)["devices"]))')" != 0 ]; then
            reason="vhostd still lists devices after every removal"
        fi
    fi
    stop_vhostd
    if [ "$vhostd_status" != 0 ]; then
        reason="${reason:+$reason; }vhostd exit status $vhostd_status"
        tail -n 10 "$LOG_DIR/vhostd.log" | sed 's/^/   | /'
    fi
    if grep -E ' (error|crit):' "$LOG_DIR/vhostd.log" | head -n 5 | sed 's/^/   vhostd| /' | grep -q .; then
        reason="${reason:+$reason; }vhostd logged errors (log $LOG_DIR/vhostd.log)"
    fi
    [ -n "$reason" ] && say "logs in $LOG_DIR"
    case_end hotplug "$reason" "libvirt domain on a vhostd disk and NIC (5 of 5 pings, verified I/O), a disk hot-plugged, checked, detached and removed; domain ${t_guest}s"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" hotplug
if case_selected hotplug; then
    start_libvirt || fatal "private libvirtd did not start (logs in $LOG_DIR)"
    case_hotplug
fi
cases_summary
