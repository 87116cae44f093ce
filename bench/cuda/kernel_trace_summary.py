#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a CSV of bench/cuda/kernel_trace.cpp.

Steps are found by a marker kernel (by default the optimizer's Adam, baton's or PyTorch's): a step ends where a
run of marker kernels ends. The first --skip steps are left out (warm-up); the rest are
averaged. Printed per step: the wall time, the time the GPU was busy (the union of kernels,
copies and memsets), the idle gaps (the longest ones with the kernels around them: the
GPU waiting for the host), the host's synchronizations, and the kernels by total time.

    python3 bench/cuda/kernel_trace_summary.py k.csv [--marker adamw] [--skip 5] [--top 30]
"""
import argparse
import collections
import csv
import re
import sys


def short(name, width):
    # "void ns::kernel<T, ...>(args)" -> "ns::kernel<T, ...>", cut to width.
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    depth, out = 0, []
    for c in name:
        if c == "(" and depth == 0:
            break
        depth += c == "<"
        depth -= c == ">"
        out.append(c)
    s = "".join(out)
    return s if len(s) <= width else s[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--marker", default="(?i)adam", help="regex of the kernel that ends a step (default: AdamW, baton's or PyTorch's)")
    ap.add_argument("--skip", type=int, default=5, help="steps left out at the start")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--gap-us", type=float, default=20.0, help="idle gaps shorter than this are not listed")
    a = ap.parse_args()

    rows = []
    with open(a.csv, newline="") as f:
        for r in csv.DictReader(f):
            rows.append((r["kind"], int(r["stream"]), int(r["start_ns"]), int(r["end_ns"]), int(r["bytes"]), r["name"]))
    if not rows:
        sys.exit(f"{a.csv}: no records")
    work = sorted((r for r in rows if r[0] != "sync"), key=lambda r: r[2])
    marker = re.compile(a.marker)
    # A step ends at the last kernel of each run of marker kernels.
    ends, in_run = [], False
    for i, r in enumerate(work):
        m = r[0] == "kernel" and marker.search(r[5]) is not None
        if in_run and not m:
            ends.append(work[i - 1][3])
        in_run = m
    if in_run:
        ends.append(work[-1][3])
    if len(ends) < a.skip + 2:
        sys.exit(f"{a.csv}: {len(ends)} steps found by marker {a.marker!r}; need at least {a.skip + 2}")
    t0, t1 = ends[a.skip], ends[-1]
    steps = len(ends) - 1 - a.skip
    win = [r for r in work if r[2] >= t0 and r[3] <= t1]

    busy, cur_s, cur_e = 0, None, None
    gaps = []  # (length, previous record, next record)
    prev = None
    for r in win:
        if cur_e is None or r[2] > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append((r[2] - cur_e, prev, r))
            cur_s, cur_e = r[2], r[3]
        else:
            cur_e = max(cur_e, r[3])
        prev = r
    if cur_e is not None:
        busy += cur_e - cur_s
    wall = t1 - t0
    ms = 1e-6 / steps
    print(f"{a.csv}: {steps} steps after {a.skip} (marker {a.marker!r})")
    print(f"per step: wall {wall * ms:.3f} ms, GPU busy {busy * ms:.3f} ms ({100 * busy / wall:.1f}%), "
          f"idle {(wall - busy) * ms:.3f} ms in {len(gaps) / steps:.0f} gaps")
    kinds = collections.Counter()
    for r in win:
        kinds[r[0]] += 1
    print("records per step: " + ", ".join(f"{k} {v / steps:.0f}" for k, v in sorted(kinds.items())))

    syncs = [r for r in rows if r[0] == "sync" and r[2] >= t0 and r[3] <= t1]
    if syncs:
        by = collections.defaultdict(lambda: [0, 0])
        for r in syncs:
            by[r[5]][0] += 1
            by[r[5]][1] += r[3] - r[2]
        print("host synchronizations per step: " + ", ".join(
            f"{k} {n / steps:.1f} ({t * ms:.3f} ms)" for k, (n, t) in sorted(by.items())))

    big = sorted((g for g in gaps if g[0] >= a.gap_us * 1e3), key=lambda g: -g[0])
    if big:
        print(f"\nidle gaps of {a.gap_us:g} us or more: {len(big) / steps:.1f} per step, "
              f"{sum(g[0] for g in big) * ms:.3f} ms per step; the longest:")
        for length, p, n in big[:12]:
            print(f"  {length / 1e3:9.1f} us  after {short(p[5], 50):50}  before {short(n[5], 50)}")

    tot = collections.defaultdict(lambda: [0, 0, 0])
    for r in win:
        key = short(r[5], 90) if r[0] == "kernel" else f"[{r[0]} {r[5]}]"
        t = tot[key]
        t[0] += 1
        t[1] += r[3] - r[2]
        t[2] += r[4]
    print(f"\n{'kernel':90} {'n/step':>7} {'ms/step':>8} {'share':>6}")
    for k, (n, t, b) in sorted(tot.items(), key=lambda kv: -kv[1][1])[: a.top]:
        extra = f"  {b * 1e-9 / (t * 1e-9):.0f} GB/s" if b and t else ""
        print(f"{k:90} {n / steps:7.1f} {t * ms:8.3f} {100 * t / busy:5.1f}%{extra}")


if __name__ == "__main__":
    main()
