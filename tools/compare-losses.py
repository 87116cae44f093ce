#!/usr/bin/env python3
"""Compares two loss logs (baton train --loss-log: JSON lines with "step" and "loss").

  compare-losses.py REFERENCE OTHER --tol 1e-4 [--relative] [--steps N]

Exit 0 when both have the same steps (the first N if given) and every loss differs by
at most tol (|a - b|, or |a - b| / |a| with --relative); 1 otherwise, naming the first
step that differs; 2 for a file that cannot be read. Used by tools/gpu-check.sh (GPU vs
CPU, PP over UCX vs one GPU) and tested in tests/tools/gpu_check_lib_test.sh.
"""
import argparse
import json
import math
import sys


def read(path):
    out = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                out[int(row["step"])] = float(row["loss"])
    except (OSError, ValueError, KeyError) as e:
        print(f"compare-losses: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("other")
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--relative", action="store_true")
    ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    ref, got = read(a.reference), read(a.other)
    steps = sorted(ref)
    if a.steps:
        steps = steps[: a.steps]
        if len(steps) < a.steps:
            print(f"compare-losses: {a.reference} has {len(steps)} steps, {a.steps} expected")
            return 1
    if not steps:
        print(f"compare-losses: {a.reference} has no losses")
        return 1
    worst = 0.0
    for s in steps:
        if s not in got:
            print(f"compare-losses: step {s} is missing from {a.other}")
            return 1
        d = abs(ref[s] - got[s])
        if a.relative:
            d /= max(abs(ref[s]), 1e-30)
        if math.isnan(got[s]) or d > a.tol:
            print(f"compare-losses: step {s}: {ref[s]:.6f} vs {got[s]:.6f} (difference {d:.3e} > {a.tol:g})")
            return 1
        worst = max(worst, d)
    print(f"compare-losses: {len(steps)} steps agree, largest difference {worst:.3e} (tolerance {a.tol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
