#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# /init of the vhostd guest-test initramfs (busybox sh, PID 1). Mounts the pseudo file
# systems, loads the virtio modules, runs the test named by vhostd.test= on the kernel command
# line with the arguments in vhostd.args="...", prints one machine-readable last line
#   GUEST-RESULT: PASS            or            GUEST-RESULT: FAIL <reason>
# on the console (ttyS0) and powers the VM off. PID 1 must never exit (that panics the kernel),
# so there is no `set -e` here: every step is checked by hand and falls through to poweroff.

export PATH=/bin:/sbin
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin
/bin/busybox --install -s /bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null # blk-mq state, for --test cmd debugging
mount -t tmpfs tmpfs /tmp

# The console is ttyS0; make sure our output goes there even if stdio is not set up.
[ -c /dev/console ] && exec </dev/console >/dev/console 2>&1

result=""
fail() {
    [ -z "$result" ] && result="$*"
}

finish() {
    # Kernel complaints count as failures: a backend that breaks the virtqueue protocol makes
    # virtio_ring warn ("virtqueue ... broken", WARN_ON), even if our I/O happened to succeed.
    bad=$(dmesg | grep -E 'WARNING:|BUG:|Oops|Call Trace|virtqueue.*broken|general protection' | head -n 5)
    if [ -n "$bad" ]; then
        echo "$bad" | sed 's/^/DMESG /'
        fail "kernel warning: $(echo "$bad" | head -n 1 | cut -c1-120)"
    fi
    # I/O errors are shown, not judged: the checks that caused them decide pass or fail.
    dmesg | grep -E 'I/O error|blk_update_request|virtio_blk' | head -n 20 | sed 's/^/DMESG /'
    echo "GUEST-UPTIME: $(cut -d' ' -f1 /proc/uptime) s"
    if [ -z "$result" ]; then
        echo "GUEST-RESULT: PASS"
    else
        echo "GUEST-RESULT: FAIL $result"
    fi
    sync
    poweroff -f
    sleep 5 # poweroff -f does not return; belt and braces against PID 1 exiting
    echo o >/proc/sysrq-trigger
}

# Insert the modules in dependency order (no modprobe/depmod in the initramfs).
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk \
         failover net_failover virtio_net; do
    if ! insmod "/lib/modules/$m.ko"; then
        fail "insmod $m failed"
    fi
done

cmdline=$(cat /proc/cmdline)
test_name=$(echo "$cmdline" | sed -n 's/.*vhostd\.test=\([^ ]*\).*/\1/p')
# vhostd.args="a b c" (quoted, spaces separate arguments) or vhostd.args=a,b,c
case "$cmdline" in
*'vhostd.args="'*) args=$(echo "$cmdline" | sed -n 's/.*vhostd\.args="\([^"]*\)".*/\1/p') ;;
*) args=$(echo "$cmdline" | sed -n 's/.*vhostd\.args=\([^ ]*\).*/\1/p' | tr ',' ' ') ;;
esac
[ -z "$test_name" ] && test_name=blk

# Behind an emulated IOMMU (run-guest.sh --iommu: intel_iommu=on): the kernel must really
# remap DMA, and every virtio PCI device must sit in a translated IOMMU group, lazy (DMA-FQ)
# or strict (DMA) as iommu.strict= asks. One "CHECK iommu:" line either way.
case "$cmdline" in
*intel_iommu=on*)
    want=DMA-FQ
    case "$cmdline" in *iommu.strict=1*) want=DMA ;; esac
    dmesg | grep -E 'DMAR' | head -n 4 | sed 's/^/INFO dmesg /'
    iommus=$(ls /sys/class/iommu 2>/dev/null | tr '\n' ' ')
    devs=""
    bad=""
    for v in /sys/bus/virtio/devices/virtio*; do
        [ -e "$v" ] || continue
        pci=$(basename "$(dirname "$(readlink -f "$v")")")
        type=$(cat "/sys/bus/pci/devices/$pci/iommu_group/type" 2>/dev/null)
        group=$(basename "$(readlink -f "/sys/bus/pci/devices/$pci/iommu_group" 2>/dev/null)")
        devs="$devs $pci:group=$group:$type"
        [ "$type" = "$want" ] || bad="$bad $pci:${type:-no-group}"
    done
    if [ -z "$iommus" ]; then
        fail "iommu: no /sys/class/iommu entry (no DMA remapping)"
    elif [ -z "$devs" ]; then
        fail "iommu: no virtio PCI device"
    elif [ -n "$bad" ]; then
        fail "iommu: devices not in a $want domain:$bad"
    else
        echo "CHECK iommu: PASS $iommus-$devs"
    fi
    ;;
esac

# Wait (bounded) for the disks: virtio_blk probes synchronously, but be tolerant.
wait_disk() {
    i=0
    while [ ! -b "/dev/$1" ] && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    [ -b "/dev/$1" ]
}

echo "GUEST-START: kernel $(uname -r), $(nproc) vCPUs, uptime $(cut -d" " -f1 /proc/uptime) s, test=$test_name args=$args"
case "$test_name" in
blk)
    if [ -z "$result" ] && ! wait_disk vda; then
        fail "no /dev/vda after loading virtio_blk"
    fi
    if [ -z "$result" ]; then
        # shellcheck disable=SC2086 # word splitting of $args is intended
        /bin/guest-blkcheck blk $args --result-file /tmp/result
        rc=$?
        if [ $rc -ne 0 ]; then
            if [ -s /tmp/result ]; then
                fail "$(cat /tmp/result)"
            else
                fail "guest-blkcheck exited with status $rc"
            fi
        fi
    fi
    ;;
rng)
    # virtio-rng over vhost-user (examples/rng, rng-guest.sh): the hw_random core must pick
    # virtio_rng, and /dev/hwrng must deliver bytes that look random.
    insmod /lib/modules/virtio-rng.ko || fail "insmod virtio-rng failed"
    i=0
    while ! grep -q virtio_rng /sys/class/misc/hw_random/rng_current 2>/dev/null &&
        [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    cur=$(cat /sys/class/misc/hw_random/rng_current 2>/dev/null)
    echo "INFO rng_available: $(cat /sys/class/misc/hw_random/rng_available 2>/dev/null)"
    case "$cur" in
    virtio_rng*) echo "CHECK rng-current: PASS $cur" ;;
    *) fail "rng_current is '$cur', not virtio_rng" ;;
    esac
    if [ -z "$result" ]; then
        if ! head -c 65536 /dev/hwrng >/tmp/r1 || ! head -c 65536 /dev/hwrng >/tmp/r2; then
            fail "reading /dev/hwrng failed"
        fi
    fi
    if [ -z "$result" ]; then
        n1=$(wc -c </tmp/r1)
        nz=$(tr -d '\000' </tmp/r1 | wc -c)  # bytes that are not zero: about 255/256 of them
        gz=$(gzip -c </tmp/r1 | wc -c)      # random data does not compress; a pattern does
        if [ "$n1" -ne 65536 ]; then
            fail "read $n1 bytes from /dev/hwrng, not 65536"
        elif [ "$nz" -lt 64000 ]; then
            fail "/dev/hwrng: only $nz of 65536 bytes are non-zero"
        elif [ "$gz" -lt 65536 ]; then
            fail "/dev/hwrng: 64 KiB compress to $gz bytes: not random"
        elif cmp -s /tmp/r1 /tmp/r2; then
            fail "/dev/hwrng: two reads returned the same 64 KiB"
        else
            echo "CHECK hwrng-read: PASS 2 x 65536 bytes, $nz non-zero, gzip $gz bytes, reads differ"
        fi
    fi
    ;;
boot)
    # Boot-only smoke test: report the disks the kernel found.
    for d in /sys/block/vd*; do
        [ -e "$d" ] && echo "INFO disk $(basename "$d"): $(cat "$d/size") sectors"
    done
    ;;
cmd)
    # Debugging aid: run vhostd.args as a shell command line, e.g.
    # run-guest.sh --test cmd --guest-args 'ls /sys/block/vda/mq'
    eval "$args" || fail "command failed: $args"
    ;;
shell)
    # Interactive debugging (run-guest.sh --interactive): leave with `exit`.
    setsid cttyhack sh
    ;;
*)
    fail "unknown vhostd.test=$test_name"
    ;;
esac
finish
