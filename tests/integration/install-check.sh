#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# install-check.sh: what `meson install` puts in place for the vhost-user ecosystem and for
# systemd, in a `meson install --destdir` tree:
#   descriptors  every share/qemu/vhost-user/*.json parses, has the schema's members
#                (description, type, binary), names an absolute binary that is installed and is
#                vhostd, and that binary's --print-capabilities reports the descriptor's type
#                (block: the read-only and blk-file features)
#   unit         `systemd-analyze verify` passes on the installed vhostd.service with no
#                message at all (paths re-rooted into the tree, man pages looked up there), and
#                flags each of three broken copies (unknown key, missing binary, bad value): a
#                check that can fail; the hardening lines are there (Type=notify, the syscall
#                filter, device policy, ...) and the filter allows io_uring and seccomp
#   config       the example configuration is installed, vhostd.conf made from it, an edited
#                vhostd.conf survives a second install, and vhostd accepts the example
# systemd-analyze comes from the systemd package, installed first when missing (as
# scripts/deps.sh does). Ends with "N passed, N failed"; exit 0 only when none failed.
#
# Env: BUILD (default: the directory of VHOSTD, else build: a configured meson build directory).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$(dirname "${VHOSTD:-$root/build/vhostd}")}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-install-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
die() {
    echo "install-check: error: $*" >&2
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
}

[ -f "$build/build.ninja" ] || die "$build is not a meson build directory (meson setup build)"
command -v python3 >/dev/null || die "python3 not found"
if ! command -v systemd-analyze >/dev/null; then
    [ "$(id -u)" = 0 ] || die "systemd-analyze not found (apt-get install systemd)"
    echo "install-check: installing systemd (for systemd-analyze)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd \
        >"$WORK/apt.log" 2>&1 || die "apt-get install systemd failed: $(tail -n 3 "$WORK/apt.log")"
fi

dest=$WORK/dest
meson install -C "$build" --destdir "$dest" --quiet >"$WORK/install.log" 2>&1 ||
    die "meson install failed: $(tail -n 5 "$WORK/install.log")"
prefix=$(meson introspect "$build" --buildoptions |
    python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
sbin_vhostd=$(find "$dest" -path '*/sbin/vhostd' | head -n 1)
[ -n "$sbin_vhostd" ] || die "meson install did not install sbin/vhostd"
libdir=$(dirname "$(find "$dest" -name 'libvhostd.so.0' | head -n 1)")

# ---- descriptors -----------------------------------------------------------------------------
descdir=$dest$prefix/share/qemu/vhost-user
n=0
for f in "$descdir"/*.json; do
    [ -e "$f" ] || break
    n=$((n + 1))
    name=$(basename "$f")
    if ! out=$(python3 - "$f" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("description", "type", "binary"):
    if not isinstance(d.get(k), str) or not d[k]:
        sys.exit("member %s missing or not a string" % k)
if not d["binary"].startswith("/"):
    sys.exit("binary %s is not absolute" % d["binary"])
if d["type"] not in ("block", "net"):
    sys.exit("type %s is not one vhostd serves" % d["type"])
if "tags" in d and not all(isinstance(t, str) for t in d["tags"]):
    sys.exit("tags must be strings")
print(d["type"], d["binary"])
PY
    ); then
        fail "descriptor/$name" "$out"
        continue
    fi
    read -r type binary <<<"$out"
    bin=$dest$binary
    # The installed link points at the installed vhostd, by its final (prefix) path.
    target=$(readlink "$bin" 2>/dev/null || echo "$binary")
    case "$target" in /*) target=$dest$target ;; *) target=$(dirname "$bin")/$target ;; esac
    if [ ! -x "$bin" ] && [ ! -L "$bin" ]; then
        fail "descriptor/$name" "binary $binary is not installed"
        continue
    fi
    if ! cmp -s "$target" "$sbin_vhostd"; then
        fail "descriptor/$name" "binary $binary is not the installed vhostd"
        continue
    fi
    # Run it under the name the descriptor gives (vhostd picks the type from it), with junk
    # options the spec says are ignored.
    caps=$(cd "$WORK" && ln -sf "$target" "$(basename "$binary")" &&
        LD_LIBRARY_PATH=$libdir "./$(basename "$binary")" --print-capabilities --no-such-option 2>&1)
    rc=$?
    if ! got=$(python3 -c '
import json, sys
c = json.loads(sys.argv[1])
want = sys.argv[2]
if c.get("type") != want:
    sys.exit("type %r, descriptor says %r" % (c.get("type"), want))
if want == "block" and sorted(c.get("features", [])) != ["blk-file", "read-only"]:
    sys.exit("block features %r" % c.get("features"))
print("ok")' "$caps" "$type" 2>&1) || [ $rc -ne 0 ]; then
        fail "descriptor/$name" "--print-capabilities (exit $rc): $got; output: $caps"
        continue
    fi
    pass "descriptor/$name ($type, $binary)"
done
for kind in blk net; do
    [ -e "$descdir/50-vhostd-$kind.json" ] || fail "descriptor/50-vhostd-$kind.json" "not installed"
done
[ $n -gt 0 ] || fail descriptors "none installed in $prefix/share/qemu/vhost-user"

# ---- systemd unit ----------------------------------------------------------------------------
unit=$(find "$dest" -name vhostd.service | head -n 1)
if [ -z "$unit" ]; then
    fail unit "vhostd.service not installed"
else
    # verify checks that the programs exist and the man pages of Documentation= are found: both
    # are in the tree, so the copy names them there. Nothing else of the unit changes.
    verify() { # verify FILE: exit status and every message of systemd-analyze verify
        MANPATH=$dest$prefix/share/man systemd-analyze verify "$1" 2>&1
    }
    mkdir -p "$WORK/ok" "$WORK/bad1" "$WORK/bad2" "$WORK/bad3"
    sed "s|$prefix/|$dest$prefix/|g" "$unit" >"$WORK/ok/vhostd.service"
    grep -q '^ExecStart=.*--rpc /run/vhostd/rpc.sock --config ' "$unit" ||
        fail unit/execstart "ExecStart lacks --rpc /run/vhostd/rpc.sock --config"
    for k in NoNewPrivileges=yes ProtectSystem=strict PrivateTmp=yes RuntimeDirectory=vhostd \
        RestrictAddressFamilies= CapabilityBoundingSet= 'ExecReload=.*/vhostctl --rpc /run/vhostd/rpc.sock reload' \
        Type=notify RuntimeDirectoryMode=0755 SupplementaryGroups=kvm \
        'SystemCallFilter=@system-service seccomp' SystemCallErrorNumber=EPERM \
        ProtectProc=invisible PrivateMounts=yes DevicePolicy=closed \
        'DeviceAllow=/dev/net/tun rw' 'DeviceAllow=block-\* rw'; do
        if grep -q "^$k\$" "$unit" || { [ "${k%=}" != "$k" ] && grep -q "^$k" "$unit"; }; then
            pass "unit/$k"
        else
            fail "unit/$k" "missing"
        fi
    done
    # The unit's syscall filter lets the daemon run: io_uring (its block I/O) and seccomp (its own
    # filter) are in it, expanded through systemd's groups.
    expand() { # expand NAME...: the syscalls of each group (recursively) or the name itself
        local x
        for x in "$@"; do
            # shellcheck disable=SC2046 # a group's members, one word each
            case $x in
            @*) expand $(systemd-analyze syscall-filter "$x" | sed -n '2,$p' | sed 's/#.*//') ;;
            *) echo "$x" ;;
            esac
        done
    }
    filter=$(sed -n 's/^SystemCallFilter=//p' "$unit")
    # shellcheck disable=SC2086 # a list of names
    allowed=$(expand $filter | sort -u)
    for sc in io_uring_setup io_uring_enter io_uring_register seccomp prctl setresuid ioctl; do
        if grep -qx "$sc" <<<"$allowed"; then
            pass "unit/syscall $sc"
        else
            fail "unit/syscall $sc" "not in SystemCallFilter=$filter"
        fi
    done
    if out=$(verify "$WORK/ok/vhostd.service") && [ -z "$out" ]; then
        pass "unit/verify"
    else
        fail "unit/verify" "systemd-analyze verify: ${out:-non-zero exit}"
    fi
    # Broken copies must be flagged (a non-zero exit or a message).
    sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$WORK/ok/vhostd.service" >"$WORK/bad1/vhostd.service"
    sed "s|^ExecStart=[^ ]*|ExecStart=$WORK/no-such-vhostd|" "$WORK/ok/vhostd.service" \
        >"$WORK/bad2/vhostd.service"
    sed 's/^RestrictAddressFamilies=.*/RestrictAddressFamilies=AF_NO_SUCH_FAMILY/' \
        "$WORK/ok/vhostd.service" >"$WORK/bad3/vhostd.service"
    for b in bad1 bad2 bad3; do
        if cmp -s "$WORK/ok/vhostd.service" "$WORK/$b/vhostd.service"; then
            fail "unit/$b" "the broken copy is the unit itself (sed matched nothing)"
        elif out=$(verify "$WORK/$b/vhostd.service") && [ -z "$out" ]; then
            fail "unit/$b" "systemd-analyze verify did not flag a broken unit"
        else
            pass "unit/$b flagged"
        fi
    done
fi

# ---- configuration ---------------------------------------------------------------------------
conf=$(find "$dest" -path '*/vhostd/vhostd.conf' | head -n 1)
if [ -z "$conf" ] || [ ! -f "$conf.example" ]; then
    fail config "vhostd.conf or vhostd.conf.example not installed"
else
    # vhostd takes the example as it is (a device line uncommented too).
    sed 's/^#blk socket=[^,]*,image=[^,]*,/blk socket=@S@,backend=null,/' "$conf.example" |
        sed "s|@S@|$WORK/c.sock|" >"$WORK/c.conf"
    if ! grep -q '^blk socket=' "$WORK/c.conf"; then
        fail config/example "no blk line to uncomment in the example"
    else
        LD_LIBRARY_PATH=$libdir timeout 20 "$sbin_vhostd" --config "$WORK/c.conf" \
            --sandbox off >"$WORK/c.log" 2>&1 &
        pid=$!
        for _ in $(seq 200); do [ -S "$WORK/c.sock" ] && break; sleep 0.05; done
        if [ -S "$WORK/c.sock" ] && kill "$pid" && wait "$pid"; then
            pass config/example
        else
            fail config/example "vhostd did not serve the example: $(tail -n 3 "$WORK/c.log")"
            kill "$pid" 2>/dev/null
        fi
    fi
    echo "# edited" >>"$conf"
    meson install -C "$build" --destdir "$dest" --quiet >"$WORK/install2.log" 2>&1 ||
        die "second meson install failed: $(tail -n 5 "$WORK/install2.log")"
    if tail -n 1 "$conf" | grep -q '^# edited$'; then
        pass config/kept
    else
        fail config/kept "a second meson install overwrote the edited vhostd.conf"
    fi
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
