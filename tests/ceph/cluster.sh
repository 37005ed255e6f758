#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A throwaway single-node Ceph cluster for the RBD tests: one monitor, one
# manager and one memstore OSD on 127.0.0.1 (messenger v1, a port of its own),
# no authentication, pool size 1, everything (data, logs, sockets, pids)
# inside DIR. Nothing outlives `stop`: each daemon is killed by its pid.
#
#   cluster.sh start DIR [POOL]  -> DIR/ceph.conf; prints "ready" once POOL
#                                   (default "rbd") exists and takes I/O
#   cluster.sh stop DIR          -> kill the daemons by pid, remove DIR
# Exit status non-zero (and a reason on stderr) when the cluster cannot start.
# CEPH_CLUSTER_OWNER=PID (start): a watchdog stops the cluster and removes DIR
# once PID is gone, so a test program killed by SIGKILL leaves nothing behind.
set -euo pipefail

usage() {
    echo "usage: $0 start DIR [POOL] | stop DIR" >&2
    exit 2
}
[ $# -ge 2 ] || usage
cmd=$1
dir=$2
pool=${3:-rbd}

# Daemons are stopped by the pids recorded here, one per line, name and pid.
pids_file() { echo "$dir/pids"; }

stop_all() {
    local f name pid i
    f=$(pids_file)
    [ -f "$f" ] || return 0
    # Reverse start order: the OSD and the manager before the monitor.
    tac "$f" | while read -r name pid; do
        kill -TERM "$pid" 2>/dev/null || continue
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "cluster.sh: $name (pid $pid) ignored SIGTERM for 10 s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$f"
}

if [ "$cmd" = stop ]; then
    if [ ! -d "$dir" ]; then
        exit 0
    fi
    stop_all
    rm -rf "$dir"
    exit 0
fi
[ "$cmd" = start ] || usage

for b in ceph-mon ceph-mgr ceph-osd ceph monmaptool ceph-authtool rbd; do
    if ! command -v "$b" >/dev/null; then
        echo "cluster.sh: $b not found (scripts/deps.sh installs the Ceph packages)" >&2
        exit 1
    fi
done
if [ -e "$dir/pids" ]; then
    echo "cluster.sh: $dir already holds a cluster (stop it first)" >&2
    exit 1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
start_ns=$(date +%s%N)

# A free loopback port for the monitor: random in 20000-29999, checked with ss.
port=
for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 10000))
    if ! ss -Htan "sport = :$p" 2>/dev/null | grep -q .; then
        port=$p
        break
    fi
done
[ -n "$port" ] || { echo "cluster.sh: no free port found" >&2; exit 1; }

fsid=$(cat /proc/sys/kernel/random/uuid)
mkdir -p "$dir/run" "$dir/log" "$dir/mon/a" "$dir/mgr/x" "$dir/osd/0"
conf="$dir/ceph.conf"
cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
mon initial members = a
public addr = 127.0.0.1
ms bind msgr1 = true
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
run dir = $dir/run
admin socket = $dir/run/\$name.\$pid.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
keyring = $dir/keyring
osd objectstore = memstore
memstore device bytes = 2147483648
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
osd crush chooseleaf type = 0
# The OSD's start-up commands to the monitor (crush location, device class)
# can leave before it has the monmap and fail with 'wrong fsid' (Ceph 16):
# the OSD then never boots. This script places it in the crush map itself
# (and retries its own commands: see cephr).
osd crush update on start = false
osd class update on start = false
# A client killed with SIGKILL keeps its watch on an image header this long
# (default 30 s); RBD's exclusive lock passes to the next client only then.
osd client watch timeout = 5
# Few threads: the machine is small and shared.
osd op num shards = 1
osd op num threads per shard = 2
mon data = $dir/mon/\$name
mgr data = $dir/mgr/\$name
osd data = $dir/osd/\$id
mgr initial modules =
CONF

ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"

# Start a daemon in the foreground of a background job (its own session),
# record its pid; its stdout/stderr go to DIR/log.
spawn() {
    local name=$1
    shift
    setsid "$@" -f >"$dir/log/$name.out" 2>&1 </dev/null &
    echo "$name $!" >>"$(pids_file)"
}

fail() {
    local f
    echo "cluster.sh: $*" >&2
    # The caller usually removes DIR: the end of each log goes with the message.
    for f in "$dir"/log/*; do
        [ -s "$f" ] || continue
        echo "--- $f (last lines) ---" >&2
        tail -n 15 "$f" >&2
    done
    echo "cluster.sh: stopping what was started" >&2
    stop_all
    exit 1
}

cephc() { timeout 30 ceph -c "$conf" "$@"; }
# A client's first command can leave before it has the monmap: the monitor
# refuses it ('wrong fsid', Ceph 16), now and then under load. One-shot
# commands (all idempotent here) are retried.
cephr() {
    local i
    for i in 1 2 3 4 5; do
        cephc "$@" && return 0
        sleep 0.5
    done
    return 1
}

spawn mon.a ceph-mon -c "$conf" -i a
for i in $(seq 1 300); do
    cephc --connect-timeout 5 mon stat >/dev/null 2>&1 && break
    [ "$i" = 300 ] && fail "the monitor did not answer within 30 s"
    sleep 0.1
done
spawn mgr.x ceph-mgr -c "$conf" -i x

osd_uuid=$(cat /proc/sys/kernel/random/uuid)
osd_id=$(cephr osd create "$osd_uuid") || fail "ceph osd create failed"
[ "$osd_id" = 0 ] || fail "expected osd id 0, got $osd_id"
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.out" 2>&1 ||
    fail "ceph-osd --mkfs failed"
cephr osd crush add osd.0 1.0 root=default >/dev/null 2>&1 || fail "ceph osd crush add failed"
spawn osd.0 ceph-osd -c "$conf" -i 0

for i in $(seq 1 600); do
    if cephc osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1'; then
        break
    fi
    [ "$i" = 600 ] && fail "the OSD did not come up within 60 s"
    sleep 0.1
done
cephr osd pool create "$pool" 8 8 >/dev/null 2>&1 || fail "cannot create pool $pool"
for i in 1 2 3 4 5; do
    timeout 60 rbd -c "$conf" pool init "$pool" && break
    [ "$i" = 5 ] && fail "rbd pool init $pool failed"
    sleep 0.5
done
# Usable: an image can be created, written and removed.
probe="cluster-probe-$$"
timeout 60 rbd -c "$conf" create --size 1M "$pool/$probe" || fail "rbd create failed"
timeout 60 rbd -c "$conf" rm --no-progress "$pool/$probe" >/dev/null || fail "rbd rm failed"
if [ -n "${CEPH_CLUSTER_OWNER:-}" ]; then
    owner=$CEPH_CLUSTER_OWNER
    self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -f "$2/pids" ]; do sleep 1; done
        [ -f "$2/pids" ] && exec "$3" stop "$2"' watchdog "$owner" "$dir" "$self" \
        >/dev/null 2>&1 </dev/null &
fi
end_ns=$(date +%s%N)
echo "ready conf=$conf pool=$pool port=$port start_ms=$(((end_ns - start_ns) / 1000000))"
