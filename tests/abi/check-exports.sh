#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# check-exports.sh LIBVHOSTD_SO INCLUDE_DIR: the shared library's ABI surface is exactly the
# public headers (docs/ABI.md):
#   - every function a header in INCLUDE_DIR/vhostd declares is exported, in a version node;
#   - nothing else is exported (no internal vhd_ function, no helper without the prefix);
#   - each header compiles on its own, as C99 and as C++ (-Wall -Wextra -Werror -pedantic);
#   - the daemon (INCLUDE_DIR/../daemon) is a client of the public API: it includes its own
#     headers and public ones (vhostd/), nothing else.
# One line per problem, then "abi: OK" or "abi: N problem(s)"; exit 0 only when OK.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 LIBVHOSTD_SO INCLUDE_DIR" >&2; exit 2; }
so=$1
inc=$2
problems=0
bad() {
    echo "abi: $*"
    problems=$((problems + 1))
}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-abi-XXXXXX")
trap 'rm -rf "$work"' EXIT

# Functions the headers declare: identifiers vhd_* followed by "(", in the preprocessed
# headers with comments gone (static inline ones are not exported and are left out).
cat >"$work/all.c" <<EOC
#include "vhostd/vhostd.h"
EOC
cc -E -P -I"$inc" "$work/all.c" >"$work/all.i" || bad "the public headers do not preprocess"
grep -v '^#' "$work/all.i" | tr '\n' ' ' | sed 's/static inline[^{]*{/\n&/g' |
    grep -v '^static inline' | grep -oE '\bvhd_[a-z0-9_]+[[:space:]]*\(' |
    sed 's/[[:space:]]*($//' | sort -u >"$work/declared"
[ -s "$work/declared" ] || bad "no declared function found in $inc/vhostd"

# Exported: defined dynamic symbols, without their version suffix; each must carry a version.
nm -D --defined-only "$so" >"$work/nm" || bad "nm failed on $so"
awk '$2 != "A" {print $3}' "$work/nm" | grep -v '^_' >"$work/raw" || true
grep -v '@@VHOSTD_' "$work/raw" | sed 's/^/unversioned export: /' | while read -r l; do echo "abi: $l"; done
problems=$((problems + $(grep -vc '@@VHOSTD_' "$work/raw" || true)))
sed 's/@.*//' "$work/raw" | sort -u >"$work/exported"

while read -r f; do bad "declared in a public header but not exported: $f"; done \
    < <(comm -23 "$work/declared" "$work/exported")
while read -r f; do bad "exported but not declared in a public header: $f"; done \
    < <(comm -13 "$work/declared" "$work/exported")

for h in "$inc"/vhostd/*.h; do
    name=vhostd/$(basename "$h")
    printf '#include "%s"\n' "$name" >"$work/one.c"
    cc -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$inc" "$work/one.c" \
        >"$work/cc.log" 2>&1 || bad "$name does not compile on its own as C99: $(head -n 1 "$work/cc.log")"
    if command -v c++ >/dev/null; then
        cp "$work/one.c" "$work/one.cc"
        c++ -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$work/one.cc" >"$work/cxx.log" 2>&1 ||
            bad "$name does not compile as C++: $(head -n 1 "$work/cxx.log")"
    fi
done

daemon=$(dirname "$inc")/daemon
if [ -d "$daemon" ]; then
    while IFS=: read -r file line inc_name; do
        case "$inc_name" in
        vhostd/*) ;;
        *) [ -f "$daemon/$inc_name" ] ||
            bad "$(basename "$file"):$line: the daemon includes \"$inc_name\", not a public header" ;;
        esac
    done < <(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$daemon"/*.c "$daemon"/*.h |
        sed 's/^\([^:]*\):\([0-9]*\):.*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1:\2:\3/')
fi

echo "abi: $(wc -l <"$work/exported") exported functions, $(wc -l <"$work/declared") declared"
if [ "$problems" -eq 0 ]; then
    echo "abi: OK"
else
    echo "abi: $problems problem(s)"
    exit 1
fi
