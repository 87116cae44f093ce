#!/usr/bin/env python3
"""Reads a measured timeline (baton train --plan ... --trace T.json) and prints how much
of the halo receives the interior rows hid: for each HALO event the part covered by the
INTERIOR event of the same rank that overlaps it; the rest (posting before the interior
starts, waiting after it ends) was exposed.

    python3 bench/halo_hidden.py T.json
Prints "halo <events> <halo ms> <hidden ms> <exposed ms> <hidden fraction> <step ms>"
(times summed over every rank and traced step; the step from the ranks' STEP ends).
"""
import json
import sys


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print("usage: python3 bench/halo_hidden.py T.json (a trace of baton train --trace)",
              file=sys.stderr)
        sys.exit(2)
    try:
        with open(sys.argv[1]) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"halo_hidden.py: {sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(2)
    events = data["traceEvents"] if isinstance(data, dict) else data
    halos = [e for e in events if e.get("cat") == "HALO"]
    interiors = [e for e in events if e.get("cat") == "INTERIOR"]
    total = hidden = 0.0
    for h in halos:
        h0, h1 = h["ts"], h["ts"] + h["dur"]
        cover = 0.0
        for i in interiors:
            if i["pid"] != h["pid"]:
                continue
            cover += max(0.0, min(h1, i["ts"] + i["dur"]) - max(h0, i["ts"]))
        total += h["dur"]
        hidden += min(cover, h["dur"])
    steps = [e for e in events if e.get("cat") == "STEP" and e.get("pid") == 0]
    ends = sorted(e["ts"] + e["dur"] for e in steps)
    step_ms = (ends[-1] - ends[-2]) / 1e3 if len(ends) >= 2 else float("nan")
    frac = hidden / total if total else float("nan")
    print(f"halo {len(halos)} {total / 1e3:.2f} {hidden / 1e3:.2f} {(total - hidden) / 1e3:.2f} {frac:.3f} {step_ms:.1f}")


if __name__ == "__main__":
    main()
