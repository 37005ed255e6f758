#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Summarise bench/side-by-side.sh results (standard library only).

Reads DIR/runs.csv (one line per run) and writes:
  DIR/side-by-side.md      the Markdown table (also printed on stdout)
  DIR/summary.json         the same medians, for scripts
  DIR/plot-CONFIG.dat      IOPS by iodepth, null backend, for bench/iops-by-iodepth.gp

Per case and daemon: the median over the rounds of IOPS, p99 latency and CPU
microseconds per I/O (each a median of per-run values). Ratios: IOPS
vhostd/qsd (higher is better for vhostd) and CPU per I/O qsd/vhostd (how many
times less CPU vhostd spends per I/O), each the median of the per-round
ratios of the two back-to-back runs of a round (paired: both saw about the
same machine), with their min-max range as the noise indicator; the ratio of
the medians is in summary.json too. When the runs include SPDK's vhost target
(side-by-side.sh --spdk-vhost), its IOPS, CPU per I/O and the paired ratios
vhostd/SPDK stand next to qsd's in the same table (n/a in the cases SPDK does
not run: the file backend).
"""
import csv
import json
import os
import statistics
import sys

CONFIG_ORDER = ["event", "adaptive", "adaptive-benchpoll", "qsd-aio-threads", "shared-event"]
CONFIG_DESC = {
    "event": "event: vhostd --poll never, qsd iothread poll-max-ns=0; bench interrupt",
    "adaptive": "adaptive: vhostd --poll adaptive (50 us), qsd iothread default adaptive "
    "polling (poll-max-ns 32768); bench interrupt",
    "adaptive-benchpoll": "adaptive-benchpoll: as adaptive, bench --completion=poll",
    "qsd-aio-threads": "qsd-aio-threads: as adaptive, qsd aio=threads (its default) instead of "
    "aio=io_uring",
    "shared-event": "shared-event: as event, but bench and daemon share one CPU (no cross-CPU "
    "wake-ups)",
}
TARGET_CASE = "null-randread-q1-d32"
TARGET = 3.0
SPDK_TARGET = 1.3  # issue 15: >= 1.3x SPDK's IOPS (polling)
OTHERS = ("qsd", "spdk")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt_int(x):
    return "n/a" if x != x else f"{x:,.0f}"


def fmt(x, nd=1):
    return "n/a" if x != x else f"{x:.{nd}f}"


def fmt_ratio(x):
    return "n/a" if x != x else f"**{x:.2f}x**"


def case_key(name):
    # null before file; queues, then iodepth ascending
    parts = name.split("-")
    backend = 0 if parts[0] == "null" else 1
    q = int(parts[2][1:])
    d = int(parts[3][1:])
    return (backend, parts[1], q, d)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/bench"
    runs = list(csv.DictReader(open(os.path.join(out, "runs.csv"))))
    groups = {}
    failed = []
    for r in runs:
        if r["status"] != "ok":
            failed.append(r)
            continue
        k = (r["config"], r["case"])
        g = groups.setdefault(k, {"completion": r["completion"]}).setdefault(r["daemon"], [])
        g.append(r)

    rows = []
    for (cfg, case), g in groups.items():
        row = {"config": cfg, "case": case, "completion": g["completion"]}
        for d in ("vhostd",) + OTHERS:
            rs = g.get(d, [])
            iops = [float(r["iops"]) for r in rs]
            m = med(iops)
            row[d] = {
                "runs": len(rs),
                "iops": m,
                "iops_all": iops,
                "spread_pct": (max(iops) - min(iops)) / m * 100 if iops and m > 0 else float("nan"),
                "p99_us": med([float(r["p99_us"]) for r in rs]),
                "p50_us": med([float(r["p50_us"]) for r in rs]),
                # /proc/PID/stat utime+stime per I/O (the primary measure) ...
                "cpu_us_per_io": med(
                    [float(r["cpu_s"]) * 1e6 / float(r["ios"]) for r in rs if float(r["ios"]) > 0]
                ),
                # ... and the schedstat (ns) one as a cross-check
                "cpu_sched_us_per_io": med([float(r["cpu_us_per_io"]) for r in rs]),
                "cores": med(
                    [float(r["cpu_s"]) / float(r["runtime_s"]) for r in rs if float(r["runtime_s"]) > 0]
                ),
                # The instrument's own cost (issue 15 §4): vhostd-bench's utime+stime per I/O.
                "bench_us_per_io": med(
                    [float(r["bench_cpu_s"]) * 1e6 / float(r["ios"]) for r in rs
                     if float(r["ios"]) > 0 and r.get("bench_cpu_s", "") not in ("", "nan")]
                ),
                "bench_cores": med(
                    [float(r["bench_cpu_s"]) / float(r["runtime_s"]) for r in rs
                     if float(r["runtime_s"]) > 0 and r.get("bench_cpu_s", "") not in ("", "nan")]
                ),
            }
        v = row["vhostd"]
        for o in OTHERS:
            q = row[o]
            # qsd's keep their historical names; SPDK's carry a suffix.
            sfx = "" if o == "qsd" else "_" + o
            row["iops_ratio_of_medians" + sfx] = (
                v["iops"] / q["iops"] if q["iops"] > 0 else float("nan")
            )
            row["cpu_ratio_of_medians" + sfx] = (
                q["cpu_us_per_io"] / v["cpu_us_per_io"]
                if v["cpu_us_per_io"] > 0 and q["cpu_us_per_io"] == q["cpu_us_per_io"]
                else float("nan")
            )
            # Paired ratios, round by round.
            by_round = {}
            for d in ("vhostd", o):
                for r in g.get(d, []):
                    by_round.setdefault(r["round"], {})[d] = r
            pi, pc = [], []
            for rnd in sorted(by_round, key=int):
                p = by_round[rnd]
                if "vhostd" not in p or o not in p:
                    continue
                a, b = p["vhostd"], p[o]
                if float(b["iops"]) > 0:
                    pi.append(float(a["iops"]) / float(b["iops"]))
                ca = float(a["cpu_s"]) / float(a["ios"]) if float(a["ios"]) > 0 else 0
                cb = float(b["cpu_s"]) / float(b["ios"]) if float(b["ios"]) > 0 else 0
                if ca > 0:
                    pc.append(cb / ca)
            row["iops_ratios" + sfx] = pi
            row["cpu_ratios" + sfx] = pc
            row["iops_ratio" + sfx] = med(pi)
            row["cpu_ratio" + sfx] = med(pc)
        rows.append(row)
    rows.sort(
        key=lambda r: (
            CONFIG_ORDER.index(r["config"]) if r["config"] in CONFIG_ORDER else 99,
            case_key(r["case"]),
        )
    )

    md = []
    env = os.path.join(out, "env.txt")
    if os.path.exists(env):
        md.append("```")
        md.extend(l.rstrip("\n") for l in open(env))
        md.append("```")
        md.append("")
    def rng(xs):
        return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "n/a"

    spdk = any(r["spdk"]["runs"] for r in rows)
    if not spdk:
        md.append(
            "| config | case | vhostd IOPS | qsd IOPS | IOPS ratio | (range) | vhostd p99 us "
            "| qsd p99 us | vhostd CPU us/IO | qsd CPU us/IO | CPU ratio | (range) "
            "| cores v / q |"
        )
        md.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    else:
        md.append(
            "| config | case | vhostd IOPS | qsd IOPS | SPDK IOPS | IOPS ×qsd | (range) "
            "| IOPS ×SPDK | (range) | vhostd p99 us | qsd p99 us | SPDK p99 us "
            "| vhostd CPU us/IO | qsd CPU us/IO | SPDK CPU us/IO | CPU ×qsd | (range) "
            "| CPU ×SPDK | (range) | cores v / q / s |"
        )
        md.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        v, q, sp = r["vhostd"], r["qsd"], r["spdk"]
        if not spdk:
            md.append(
                f"| {r['config']} | {r['case']} | {fmt_int(v['iops'])} | {fmt_int(q['iops'])} "
                f"| **{fmt(r['iops_ratio'], 2)}x** | {rng(r['iops_ratios'])} "
                f"| {fmt(v['p99_us'])} | {fmt(q['p99_us'])} "
                f"| {fmt(v['cpu_us_per_io'], 2)} | {fmt(q['cpu_us_per_io'], 2)} "
                f"| **{fmt(r['cpu_ratio'], 2)}x** | {rng(r['cpu_ratios'])} "
                f"| {fmt(v['cores'], 2)} / {fmt(q['cores'], 2)} |"
            )
            continue
        md.append(
            f"| {r['config']} | {r['case']} | {fmt_int(v['iops'])} | {fmt_int(q['iops'])} "
            f"| {fmt_int(sp['iops'])} "
            f"| **{fmt(r['iops_ratio'], 2)}x** | {rng(r['iops_ratios'])} "
            f"| {fmt_ratio(r['iops_ratio_spdk'])} | {rng(r['iops_ratios_spdk'])} "
            f"| {fmt(v['p99_us'])} | {fmt(q['p99_us'])} | {fmt(sp['p99_us'])} "
            f"| {fmt(v['cpu_us_per_io'], 2)} | {fmt(q['cpu_us_per_io'], 2)} "
            f"| {fmt(sp['cpu_us_per_io'], 2)} "
            f"| **{fmt(r['cpu_ratio'], 2)}x** | {rng(r['cpu_ratios'])} "
            f"| {fmt_ratio(r['cpu_ratio_spdk'])} | {rng(r['cpu_ratios_spdk'])} "
            f"| {fmt(v['cores'], 2)} / {fmt(q['cores'], 2)} / {fmt(sp['cores'], 2)} |"
        )
    md.append("")
    md.append(
        "IOPS, p99 and CPU per I/O: medians over the rounds. IOPS ratio = vhostd/qsd, CPU "
        "ratio = qsd CPU per I/O / vhostd CPU per I/O (both > 1 favour vhostd): the median "
        "of the per-round ratios of back-to-back runs, (range) their min-max over the "
        "rounds. CPU = the daemon's utime+stime (/proc/PID/stat) over the run; cores = CPU "
        "seconds per second of run."
        + (
            " ×SPDK columns: the same paired ratios against SPDK's vhost target (a null bdev "
            "that does not zero the buffer; its reactor polls whatever the config: "
            "~1.0 core on an idle CPU); n/a where SPDK did not run (file cases)."
            if spdk
            else ""
        )
    )
    for c in CONFIG_ORDER:
        if any(r["config"] == c for r in rows):
            md.append(f"- {CONFIG_DESC[c]}")
    md.append("")
    # The instrument: what vhostd-bench itself spends per I/O beside each daemon. A bench that
    # polls burns its whole CPU (cores ~1.0) whatever it gets; its CPU per I/O next to the
    # daemon's says which side does more work per I/O, i.e. which one bounds the rate.
    daemons = ("vhostd",) + tuple(o for o in OTHERS if any(r[o]["runs"] for r in rows))
    md.append(
        "The instrument (vhostd-bench's own utime+stime per I/O and cores, next to each "
        "daemon's CPU per I/O):"
    )
    md.append("")
    md.append(
        "| config | case | "
        + " | ".join(f"{d}: bench / daemon CPU us/IO | bench cores" for d in daemons)
        + " |"
    )
    md.append("|---|---|" + "--:|--:|" * len(daemons))
    for r in rows:
        cells = []
        for d in daemons:
            x = r[d]
            cells.append(
                f"{fmt(x['bench_us_per_io'], 2)} / {fmt(x['cpu_us_per_io'], 2)} "
                f"| {fmt(x['bench_cores'], 2)}"
            )
        md.append(f"| {r['config']} | {r['case']} | " + " | ".join(cells) + " |")
    md.append("")
    md.append(f"Target (issue 4): {TARGET_CASE}, vhostd >= {TARGET:.0f}x qsd IOPS and >= "
              f"{TARGET:.0f}x less CPU per I/O:")
    md.append("")
    for r in rows:
        if r["case"] != TARGET_CASE:
            continue
        ok_i = "met" if r["iops_ratio"] >= TARGET else "NOT met"
        ok_c = "met" if r["cpu_ratio"] >= TARGET else "NOT met"
        md.append(
            f"- {r['config']}: IOPS {fmt(r['iops_ratio'], 2)}x ({ok_i}; rounds "
            f"{', '.join(f'{x:.2f}' for x in r['iops_ratios'])}), CPU/IO "
            f"{fmt(r['cpu_ratio'], 2)}x less ({ok_c}; rounds "
            f"{', '.join(f'{x:.2f}' for x in r['cpu_ratios'])})"
        )
    if spdk:
        md.append("")
        md.append(f"Against SPDK (issue 15): {TARGET_CASE}, vhostd >= {SPDK_TARGET}x SPDK IOPS:")
        md.append("")
        for r in rows:
            if r["case"] != TARGET_CASE or not r["spdk"]["runs"]:
                continue
            ok_i = "met" if r["iops_ratio_spdk"] >= SPDK_TARGET else "NOT met"
            md.append(
                f"- {r['config']}: IOPS {fmt(r['iops_ratio_spdk'], 2)}x ({ok_i}; rounds "
                f"{', '.join(f'{x:.2f}' for x in r['iops_ratios_spdk'])}), CPU/IO "
                f"{fmt(r['cpu_ratio_spdk'], 2)}x less"
            )
    if failed:
        md.append("")
        md.append(f"{len(failed)} run(s) failed and are left out:")
        for r in failed:
            md.append(f"- {r['config']} {r['case']} {r['daemon']} round {r['round']}: {r['status']}")
    text = "\n".join(md) + "\n"
    open(os.path.join(out, "side-by-side.md"), "w").write(text)
    sys.stdout.write(text)
    json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)

    # Plot data: IOPS by iodepth, null randread, per config.
    for c in CONFIG_ORDER:
        pts = {}
        for r in rows:
            if r["config"] != c or not r["case"].startswith("null-randread-"):
                continue
            _, _, qs, ds = r["case"].split("-")
            pts.setdefault(int(ds[1:]), {})[int(qs[1:])] = (r["vhostd"]["iops"], r["qsd"]["iops"])
        if not pts:
            continue
        with open(os.path.join(out, f"plot-{c}.dat"), "w") as f:
            f.write("# iodepth vhostd_q1 qsd_q1 vhostd_q2 qsd_q2 (IOPS; NaN: not run)\n")
            for d in sorted(pts):
                v1, q1 = pts[d].get(1, (float("nan"),) * 2)
                v2, q2 = pts[d].get(2, (float("nan"),) * 2)
                f.write(f"{d} {v1:.0f} {q1:.0f} {v2:.0f} {q2:.0f}\n".replace("nan", "NaN"))


if __name__ == "__main__":
    main()
