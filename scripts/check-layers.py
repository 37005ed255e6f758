#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""
check-layers: every project include points down. Resolves each #include of
the project's C files (src/, include/, daemon/, tools/, bench/, examples/) the
way the compiler does (the including file's directory, then include/ and src/)
and fails when a file includes from a layer above its own or from a sibling
layer, when a public header includes anything internal, when an include
does not resolve, or names its header with ../ instead of from src/ or
include/. The order is written down in docs/ARCHITECTURE.md ("Layers").

Usage: scripts/check-layers.py [ROOT]   (default: the repository holding this script)
Before checking ROOT it checks a small tree of its own with one bad include of
each kind, and fails if any of them passes (a check that cannot fail is none).
Exit status 0 when clean, 1 otherwise.
"""
import os
import re
import sys
import tempfile

# (directory, layer, level): a file may include its own layer and any layer of a
# lower level. Layers of one level are siblings and do not include each other
# (except through OPEN below). The longest matching directory wins.
LAYERS = [
    ("src/spec", "spec", 0),  # wire formats: virtio rings, blk, net, vhost-user messages
    ("src/util", "util", 0),  # compiler helpers, bits, clocks, iovec copies
    ("src/core", "core", 1),  # guest memory, virtqueue engine, inflight, dirty log
    ("src/runtime", "runtime", 2),  # workers, device contract (dev.h), logs, eventfds
    ("src/transport", "transport", 3),  # vhost-user device side
    ("src/dev", "dev", 3),  # virtio-blk and virtio-net devices
    ("src/backend", "backend", 3),  # blk and net backends behind their contract headers
    ("src/driver", "driver", 3),  # userspace drivers: driver rings, vhost-user front-end
    ("src/api", "api", 4),  # the public API's implementation
    ("include/vhostd", "public", None),  # public headers: include nothing internal
    ("daemon", "daemon", 5),
    ("tools", "tools", 5),
    ("bench", "bench", 5),
    ("examples", "examples", 5),  # embedders' examples: public headers only
]

# Layers whose files may include public headers (and their own) only.
PUBLIC_ONLY = {"public", "examples", "daemon"}  # the daemon is one user of the public API

# Headers a sibling layer may include, and why. Keep this short: each entry is a
# seam, not a shortcut.
OPEN = [
    ("dev", "src/backend/blk_backend.h", "the blk backend contract: the device drives backends"),
    ("dev", "src/backend/net_backend.h", "the net backend contract: the device drives backends"),
    ("driver", "src/transport/vu_sock.h",
     "vhost-user message framing: the same code serves both ends of the socket"),
]

# Where the compiler looks after the including file's directory (meson: include_directories).
SEARCH = ["include", "src"]
ROOTS = ["src", "include", "daemon", "tools", "bench", "examples"]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(rel):
    best = None
    for d, name, level in LAYERS:
        if (rel == d or rel.startswith(d + "/")) and (best is None or len(d) > len(best[0])):
            best = (d, name, level)
    return best


def resolve(root, rel_dir, target, quoted):
    """The repository-relative path of target, or None (a system header or nothing)."""
    bases = ([rel_dir] if quoted else []) + SEARCH
    for b in bases:
        p = os.path.normpath(os.path.join(b, target))
        if not p.startswith("..") and os.path.isfile(os.path.join(root, p)):
            return p
    return None


def check(root):
    """Returns (files, includes, problems, open entries used)."""
    problems, used = [], set()
    nfiles = nincl = 0
    for top in ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith((".c", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, fn), root)
                me = layer_of(rel)
                nfiles += 1
                if me is None:
                    problems.append(f"{rel}: not in any layer (add its directory to LAYERS)")
                    continue
                with open(os.path.join(root, rel), errors="replace") as f:
                    lines = f.readlines()
                for lineno, line in enumerate(lines, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    quoted, target = m.group(1) == '"', m.group(2)
                    if target.startswith("../"):
                        problems.append(f"{rel}:{lineno}: \"{target}\": name it from src/ or "
                                        "include/, not with ../")
                        continue
                    t = resolve(root, os.path.dirname(rel), target, quoted)
                    if t is None:
                        if quoted:
                            problems.append(f"{rel}:{lineno}: \"{target}\" does not resolve")
                        continue  # <system header>
                    nincl += 1
                    why = verdict(me, rel, t, used)
                    if why:
                        problems.append(f"{rel}:{lineno}: includes {t}: {why}")
    return nfiles, nincl, problems, used


def verdict(me, rel, t, used):
    """None when rel (of layer me) may include t, else the reason it may not."""
    _, mine, mylevel = me
    it = layer_of(t)
    if it is None:
        return "the header is in no layer"
    _, theirs, level = it
    if theirs == mine:
        return None
    if theirs == "public":
        return None  # public headers include nothing internal (checked on their side)
    if mine in PUBLIC_ONLY:
        return f"{mine} files include public headers (include/vhostd/) only"
    if level < mylevel:
        return None
    for who, hdr, _ in OPEN:
        if who == mine and hdr == t:
            used.add((who, hdr))
            return None
    where = "a sibling of" if level == mylevel else "above"
    return f"{theirs} (level {level}) is {where} {mine} (level {mylevel})"


def self_test():
    """A tree with one bad include of each kind: each must be reported."""
    bad = {
        "src/core/a.h": '#include "runtime/dev.h"\n',  # up
        "src/backend/b.c": '#include "dev/net.h"\n',  # sibling (not open)
        "include/vhostd/c.h": '#include "core/vq.h"\n',  # public includes internal
        "examples/d.c": '#include "util/compiler.h"\n',  # example below the public API
        "src/transport/e.c": '#include "nowhere.h"\n',  # does not resolve
        "src/mystery/f.c": "",  # in no layer
        "src/driver/g.h": '#include "../core/vq.h"\n',  # a ../ path (the layer would pass)
        "daemon/h.c": '#include "dev/net.h"\n',  # the daemon uses the public API only
    }
    good = {
        "src/runtime/dev.h": '#include "core/vq.h"\n#include <stdint.h>\n',
        "src/core/vq.h": '#include "spec/virtio.h"\n#include "util/compiler.h"\n',
        "src/spec/virtio.h": "", "src/util/compiler.h": "", "src/dev/net.h": "",
        "src/dev/x.c": '#include "net.h"\n#include "backend/net_backend.h"\n',
        "src/backend/net_backend.h": '#include "runtime/dev.h"\n',
        "include/vhostd/ok.h": '#include "vhostd/c.h"\n',
        "daemon/main.c": '#include "vhostd/ok.h"\n#include "opts.h"\n',
        "daemon/opts.h": "",
        "tools/t.c": '#include "vhostd/ok.h"\n#include "dev/net.h"\n',
    }
    with tempfile.TemporaryDirectory() as d:
        for name, text in {**good, **bad}.items():
            os.makedirs(os.path.join(d, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        _, _, problems, _ = check(d)
    missed = [n for n in bad if not any(p.startswith(n + ":") for p in problems)]
    wrong = [p for p in problems if not any(p.startswith(n + ":") for n in bad)]
    for n in missed:
        print(f"check-layers self-test: {n} ({bad[n].strip() or 'no layer'}) was not reported")
    for p in wrong:
        print(f"check-layers self-test: reported a good include: {p}")
    return not missed and not wrong


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    if not self_test():
        print("check-layers: the self-test failed")
        return 1
    nfiles, nincl, problems, used = check(root)
    for p in problems:
        print(p)
    for who, hdr, _ in OPEN:
        if (who, hdr) not in used:
            print(f"note: OPEN entry ({who}, {hdr}) is no longer used")
    print(f"check-layers: {nfiles} files, {nincl} project includes, {len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
