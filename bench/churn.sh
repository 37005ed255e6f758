#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/churn.sh: does adding and removing devices disturb a running one? (issue 13 §3)
# One vhostd --rpc (2 workers); a measured null blk device runs vhostd-bench QD32 randread for
# RUNTIME seconds per run. Runs alternate: quiet (nothing else happens) and churn (a JSON-RPC
# client on the management socket adds 200 null blk devices, then removes them, over and over,
# for the whole run). Prints every run's p99 and p999 latency and the churn's operation count,
# then the medians per mode, with the load average before and after.
#
# Usage: bench/churn.sh [ROUNDS (5)] [RUNTIME seconds (5)]
#   env BUILD (default build), DEVICES (200), WORKERS (2)
# Every process the script starts is stopped by pid on exit; the scratch directory is removed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$root/build}
ROUNDS=${1:-5}
RUNTIME=${2:-5}
DEVICES=${DEVICES:-200}
WORKERS=${WORKERS:-2}
dir=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-churn.XXXXXX")
vhostd_pid=""
churn_pid=""

cleanup() {
    [ -z "$churn_pid" ] || { kill "$churn_pid" 2>/dev/null || true; wait "$churn_pid" 2>/dev/null || true; }
    [ -z "$vhostd_pid" ] || { kill "$vhostd_pid" 2>/dev/null || true; wait "$vhostd_pid" 2>/dev/null || true; }
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The churner: one persistent JSON-RPC connection; add DEVICES null blk devices, remove them,
# repeat until SIGTERM; then print the number of operations done (each one answered).
cat >"$dir/churn.py" <<'EOF'
import json, signal, socket, sys
rpc, sdir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(rpc)
f = s.makefile("rwb")
ops, rid = 0, 0
def call(method, params):
    global ops, rid
    rid += 1
    f.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
    f.flush()
    r = json.loads(f.readline())
    if "error" in r:
        sys.exit("churn: %s: %s" % (method, r["error"]))
    ops += 1
while not stop:
    for i in range(n):
        call("device.add", {"kind": "blk", "spec": "socket=%s/c%d.sock,backend=null,size=64M" % (sdir, i)})
    for i in range(n):
        call("device.remove", {"name": "c%d.sock" % i})
print(ops)
EOF

"$BUILD/vhostd" --rpc "$dir/rpc.sock" --workers "$WORKERS" --log-level warn >"$dir/vhostd.log" 2>&1 &
vhostd_pid=$!
for _ in $(seq 100); do [ -S "$dir/rpc.sock" ] && break; sleep 0.05; done
"$BUILD/vhostctl" --rpc "$dir/rpc.sock" add blk "socket=$dir/m.sock,backend=null,size=1G" >/dev/null

p99() { python3 -c 'import json,sys; t=json.load(sys.stdin)["total"]["lat_us"]; print(t["p99"], t["p99_9"])'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $ROUNDS rounds of ${RUNTIME}s, QD32 randread 4k, $DEVICES devices churned"
printf '%-6s %-6s %10s %10s %10s\n' round mode p99_us p999_us churn_ops
: >"$dir/results"
for r in $(seq "$ROUNDS"); do
    # alternate the order every round: quiet first on odd rounds, churn first on even ones
    if [ $((r % 2)) = 1 ]; then modes="quiet churn"; else modes="churn quiet"; fi
    for mode in $modes; do
        ops=0
        if [ "$mode" = churn ]; then
            python3 "$dir/churn.py" "$dir/rpc.sock" "$dir" "$DEVICES" >"$dir/ops" &
            churn_pid=$!
        fi
        json=$("$BUILD/vhostd-bench" --socket="$dir/m.sock" --iodepth=32 --runtime="$RUNTIME" --json 2>/dev/null)
        if [ "$mode" = churn ]; then
            kill -TERM "$churn_pid"
            wait "$churn_pid"
            churn_pid=""
            ops=$(cat "$dir/ops")
            # leave no churn device behind for the next run
            for i in $(seq 0 $((DEVICES - 1))); do
                "$BUILD/vhostctl" --rpc "$dir/rpc.sock" remove "c$i.sock" >/dev/null 2>&1 || true
            done
        fi
        read -r a b <<<"$(echo "$json" | p99)"
        printf '%-6s %-6s %10s %10s %10s\n' "$r" "$mode" "$a" "$b" "$ops"
        echo "$mode $a $b $ops" >>"$dir/results"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$dir/results" "$RUNTIME" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for mode in ("quiet", "churn"):
    p99 = [float(r[1]) for r in rows if r[0] == mode]
    p999 = [float(r[2]) for r in rows if r[0] == mode]
    ops = [int(r[3]) for r in rows if r[0] == mode]
    print("median %-5s: p99 %8.1f us, p99.9 %8.1f us%s" % (mode, statistics.median(p99),
          statistics.median(p999), ", %.0f RPC add/remove per second" % (statistics.median(ops) / float(sys.argv[2])) if mode == "churn" else ""))
EOF
bad=$(grep -E ' (error|warn):' "$dir/vhostd.log" | grep -v 'sandbox: --rpc as root without --user' | head -n 5 || true)
[ -z "$bad" ] || printf 'vhostd logged:\n%s\n' "$bad"
