#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# meson install script: put the example configuration in place as the
# configuration itself only when there is none (an admin's file is never
# overwritten). $1: the example, $2: the configuration, both under the prefix.
set -eu
conf="${DESTDIR:-}$2"
[ -e "$conf" ] && exit 0
mkdir -p "$(dirname "$conf")"
cp "${DESTDIR:-}$1" "$conf"
chmod 0644 "$conf"
