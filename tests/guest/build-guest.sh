#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# build-guest.sh OUTDIR: builds the guest used by the vhost-user-blk guest tests, once, and
# caches it in OUTDIR (e.g. build/guest):
#   OUTDIR/vmlinuz            Debian 12's linux-image-6.1.0-*-amd64 kernel (bzImage)
#   OUTDIR/vmlinux            the same kernel decompressed on the host: an ELF with a PVH entry
#                             note, which QEMU boots directly. Under TCG this skips the guest's
#                             own xz decompression and saves 3-8 s per boot.
#   OUTDIR/modules/*.ko       virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev
#                             virtio_pci virtio_blk failover net_failover virtio_net virtio-rng
#                             (uncompressed)
#   OUTDIR/guest-blkcheck     tests/guest/guest-blkcheck.c, gcc -static (also runs on the host)
#   OUTDIR/initramfs.cpio.gz  busybox-static + the modules + guest-blkcheck + init.sh as /init
# Idempotent: every output is rebuilt only when it is missing or older than its inputs. The
# kernel .deb is fetched with `apt-get download` (apt-get update only if that fails); set
# KERNEL_DEB=/path/linux-image-...deb to use a local package instead. Must run as root (the
# initramfs holds a /dev/console device node). Needs: apt, dpkg-deb, gcc + libc6-dev, cpio,
# gzip, xz-utils, busybox-static (see packages.txt).
set -euo pipefail

MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk
failover net_failover virtio_net virtio-rng"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
    echo "build-guest: error: $*" >&2
    exit 1
}
log() {
    echo "build-guest: $*"
}

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUT=$1
[ "$(id -u)" -eq 0 ] || die "must run as root (mknod of /dev/console in the initramfs)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in dpkg-deb gcc cpio gzip xz readelf; do
    command -v "$tool" >/dev/null || die "'$tool' not found; install the packages in $HERE/packages.txt"
done
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing; apt-get install busybox-static"
if readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    die "$BUSYBOX is dynamically linked; apt-get install busybox-static"
fi

# newer_than OUTPUT INPUT...: true if OUTPUT exists and is newer than every INPUT.
up_to_date() {
    local out=$1
    shift
    [ -e "$out" ] || return 1
    local in
    for in in "$@"; do
        [ "$out" -nt "$in" ] || return 1
    done
}

# ---- 1. kernel and modules -------------------------------------------------------------
kernel_complete() {
    [ -s "$OUT/vmlinuz" ] || return 1
    local m
    for m in $MODULES; do
        [ -s "$OUT/modules/$m.ko" ] || return 1
    done
}

# Name of the real kernel package behind the linux-image-amd64 metapackage.
kernel_pkg_name() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1
}

# apt_download DIR PKG: apt-get download into DIR, output kept in DIR/apt.log.
apt_download() {
    (cd "$1" && apt-get download "$2") >"$1/apt.log" 2>&1
}

fetch_kernel_deb() {
    local dir=$1 pkg
    pkg=$(kernel_pkg_name)
    if [ -z "$pkg" ]; then
        log "apt-cache does not know linux-image-amd64; running apt-get update"
        apt-get update -qq || die "apt-get update failed"
        pkg=$(kernel_pkg_name)
        [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 to a kernel package"
    fi
    log "downloading $pkg"
    if ! apt_download "$dir" "$pkg"; then
        log "download failed ($(tail -n 1 "$dir/apt.log")); running apt-get update and retrying"
        apt-get update -qq || die "apt-get update failed"
        pkg=$(kernel_pkg_name)
        if ! apt_download "$dir" "$pkg"; then
            cat "$dir/apt.log" >&2
            die "apt-get download $pkg failed"
        fi
    fi
    ls "$dir"/linux-image-*.deb >/dev/null 2>&1 || die "apt-get download produced no .deb"
}

if kernel_complete; then
    log "kernel up to date ($(cat "$OUT/kernel-version" 2>/dev/null || echo '?'))"
else
    tmp=$(mktemp -d "$OUT/.kernel.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    if [ -n "${KERNEL_DEB:-}" ]; then
        [ -f "$KERNEL_DEB" ] || die "KERNEL_DEB=$KERNEL_DEB does not exist"
        cp "$KERNEL_DEB" "$tmp/"
    else
        fetch_kernel_deb "$tmp"
    fi
    deb=$(find "$tmp" -maxdepth 1 -name '*.deb' | head -n 1)
    log "extracting $(basename "$deb")"
    dpkg-deb -x "$deb" "$tmp/root" || die "dpkg-deb -x $deb failed"
    vmlinuz=$(find "$tmp/root/boot" -maxdepth 1 -name 'vmlinuz-*' 2>/dev/null | head -n 1)
    [ -n "$vmlinuz" ] || die "no /boot/vmlinuz-* in $deb"
    kver=${vmlinuz##*/vmlinuz-}
    moddir="$tmp/root/lib/modules/$kver"
    [ -d "$moddir" ] || die "no /lib/modules/$kver in $deb"
    rm -rf "$OUT/modules"
    mkdir -p "$OUT/modules.new"
    for m in $MODULES; do
        f=$(find "$moddir/kernel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" -o -name "$m.ko.gz" | head -n 1)
        [ -n "$f" ] || die "module $m not found in $deb"
        # busybox insmod cannot load compressed modules: decompress on the host.
        case "$f" in
        *.ko) cp "$f" "$OUT/modules.new/$m.ko" ;;
        *.ko.xz) xz -dc "$f" >"$OUT/modules.new/$m.ko" ;;
        *.ko.gz) gzip -dc "$f" >"$OUT/modules.new/$m.ko" ;;
        *.ko.zst)
            command -v zstd >/dev/null || die "$f is zstd-compressed; apt-get install zstd"
            zstd -qdc "$f" >"$OUT/modules.new/$m.ko"
            ;;
        esac
    done
    mv "$OUT/modules.new" "$OUT/modules"
    cp "$vmlinuz" "$OUT/vmlinuz.new" && mv "$OUT/vmlinuz.new" "$OUT/vmlinuz"
    echo "$kver" >"$OUT/kernel-version"
    rm -rf "$tmp"
    trap - EXIT
    log "kernel $kver ready"
fi

# ---- 1b. uncompressed, PVH-bootable vmlinux ---------------------------------------------
# The bzImage holds the kernel as one xz stream (CONFIG_KERNEL_XZ): find its magic, inflate
# it and keep the result only if it is an ELF with XEN_ELFNOTE_PHYS32_ENTRY (note type 0x12).
if up_to_date "$OUT/vmlinux" "$OUT/vmlinuz"; then
    log "vmlinux up to date"
else
    rm -f "$OUT/vmlinux"
    off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$OUT/vmlinuz" | head -n 1 | cut -d: -f1 || true)
    # (through a file: xz --single-stream stops reading early, which would SIGPIPE a pipe)
    if [ -n "$off" ] && tail -c +$((off + 1)) "$OUT/vmlinuz" >"$OUT/vmlinux.xz" &&
        xz -dc --single-stream "$OUT/vmlinux.xz" >"$OUT/vmlinux.new" 2>/dev/null &&
        readelf -n "$OUT/vmlinux.new" 2>/dev/null | grep -c 'note type: (0x00000012)' >/dev/null; then
        mv "$OUT/vmlinux.new" "$OUT/vmlinux"
        rm -f "$OUT/vmlinux.xz"
        log "vmlinux ready (PVH entry; run-guest.sh boots it instead of vmlinuz)"
    else
        rm -f "$OUT/vmlinux.new" "$OUT/vmlinux.xz"
        log "note: could not extract a PVH vmlinux from vmlinuz; guests boot the slower bzImage"
    fi
fi

# ---- 2. the static test program ---------------------------------------------------------
if up_to_date "$OUT/guest-blkcheck" "$HERE/guest-blkcheck.c" "$HERE/build-guest.sh"; then
    log "guest-blkcheck up to date"
else
    log "compiling guest-blkcheck"
    gcc -std=c11 -static -O2 -Wall -Wextra -Werror -pthread \
        -o "$OUT/guest-blkcheck.new" "$HERE/guest-blkcheck.c" ||
        die "compiling guest-blkcheck.c failed (static linking also needs libc6-dev)"
    mv "$OUT/guest-blkcheck.new" "$OUT/guest-blkcheck"
fi

# ---- 3. the initramfs -------------------------------------------------------------------
mods=()
for m in $MODULES; do
    mods+=("$OUT/modules/$m.ko")
done
if up_to_date "$OUT/initramfs.cpio.gz" "$HERE/init.sh" "$HERE/build-guest.sh" \
    "$OUT/guest-blkcheck" "$BUSYBOX" "${mods[@]}"; then
    log "initramfs up to date"
else
    log "packing initramfs"
    stage=$(mktemp -d "$OUT/.initramfs.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage"/{bin,sbin,dev,proc,sys,tmp,run,lib/modules}
    cp "$BUSYBOX" "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    cp "$OUT/guest-blkcheck" "$stage/bin/guest-blkcheck"
    cp "${mods[@]}" "$stage/lib/modules/"
    install -m 0755 "$HERE/init.sh" "$stage/init"
    mknod -m 0600 "$stage/dev/console" c 5 1
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z |
        cpio --null --create --format=newc --owner=0:0 --quiet) |
        gzip -1 >"$OUT/initramfs.cpio.gz.new"
    mv "$OUT/initramfs.cpio.gz.new" "$OUT/initramfs.cpio.gz"
    rm -rf "$stage"
    trap - EXIT
    log "initramfs ready ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1))"
fi
log "guest ready in $OUT"
