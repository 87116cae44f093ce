#!/usr/bin/env python3
"""Compares two loss logs (baton train --loss-log: JSON lines with "step" and "loss").

  compare-losses.py REFERENCE OTHER --tol 1e-4 [--relative] [--steps N]
  compare-losses.py REFERENCE OTHER --skipped-at-most K --falls

Exit 0 when both have the same steps (the first N if given) and every loss differs by
at most tol (|a - b|, or |a - b| / |a| with --relative); 1 otherwise, naming the first
step that differs; 2 for a file that cannot be read. Without --tol the losses are not
compared, only the steps' presence. For a run with dynamic loss scaling (fp16), whose
losses follow another precision's only loosely: --skipped-at-most K fails when OTHER
skipped more than K steps for overflow ("skipped": true), --falls when its last loss is
not below its first (a scaler that skips or unscales wrongly trains nothing). Used by
tools/gpu-check.sh (GPU vs CPU, PP over UCX vs one GPU, fp16's scaling) and tested in
tests/tools/gpu_check_lib_test.sh.
"""
import argparse
import json
import math
import sys


def read(path, skipped=None):
    out = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                # baton writes a non-finite loss as null (JSON has no NaN): compared as NaN.
                loss = row["loss"]
                out[int(row["step"])] = math.nan if loss is None else float(loss)
                if skipped is not None and row.get("skipped") is True:
                    skipped.append(int(row["step"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"compare-losses: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("other")
    ap.add_argument("--tol", type=float)
    ap.add_argument("--relative", action="store_true")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--skipped-at-most", type=int)
    ap.add_argument("--falls", action="store_true")
    a = ap.parse_args()
    if a.tol is None and a.skipped_at_most is None and not a.falls:
        ap.error("give --tol, --skipped-at-most or --falls")
    skipped = []
    ref, got = read(a.reference), read(a.other, skipped)
    if a.skipped_at_most is not None and len(skipped) > a.skipped_at_most:
        print(f"compare-losses: {a.other} skipped {len(skipped)} steps for overflow "
              f"(at most {a.skipped_at_most}): {skipped}")
        return 1
    if a.falls and got:
        first, last = got[min(got)], got[max(got)]
        if not last < first:
            print(f"compare-losses: {a.other}: the loss did not fall ({first:.6f} at step "
                  f"{min(got)}, {last:.6f} at step {max(got)})")
            return 1
    steps = sorted(ref)
    if a.steps:
        steps = steps[: a.steps]
        if len(steps) < a.steps:
            print(f"compare-losses: {a.reference} has {len(steps)} steps, {a.steps} expected")
            return 1
    if not steps:
        print(f"compare-losses: {a.reference} has no losses")
        return 1
    # Without --steps both logs hold the same steps: extra steps in OTHER had passed.
    extra = sorted(set(got) - set(ref)) if not a.steps else []
    if extra:
        print(f"compare-losses: {a.other} has step {extra[0]}, which {a.reference} lacks")
        return 1
    worst = 0.0
    for s in steps:
        if s not in got:
            print(f"compare-losses: step {s} is missing from {a.other}")
            return 1
        # A NaN reference had passed every comparison (NaN > tol is false).
        if math.isnan(ref[s]):
            print(f"compare-losses: step {s}: the loss is NaN in the reference {a.reference}")
            return 1
        if a.tol is None:
            if math.isnan(got[s]):
                print(f"compare-losses: step {s}: the loss is NaN")
                return 1
            continue
        d = abs(ref[s] - got[s])
        if a.relative:
            d /= max(abs(ref[s]), 1e-30)
        if math.isnan(got[s]) or d > a.tol:
            print(f"compare-losses: step {s}: {ref[s]:.6f} vs {got[s]:.6f} (difference {d:.3e} > {a.tol:g})")
            return 1
        worst = max(worst, d)
    if a.tol is None:
        print(f"compare-losses: {len(steps)} steps present, {len(skipped)} skipped for overflow")
        return 0
    print(f"compare-losses: {len(steps)} steps agree, largest difference {worst:.3e} (tolerance {a.tol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
