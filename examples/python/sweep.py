"""Every generator over the number of micro-batches, and the automatic schedule over
memory limits: makespan, bubble and peak activation memory on one set of costs.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python/sweep.py [out]

Writes <out>.png when matplotlib is installed, and <out>.csv always (default out:
schedule_sweep)."""

import csv
import sys

import baton

P = 8
COSTS = {"forward": 1.0, "backward_input": 1.2, "backward_weight": 0.8}


def main(out="schedule_sweep"):
    rows = []
    for name in baton.schedule_names():
        for m in (8, 16, 24, 32, 48, 64):
            try:
                s = baton.generate(name, P, m)
            except baton.InputError:
                continue  # outside the schedule's domain (e.g. dualpipe needs m >= 2p)
            r = baton.simulate(s, COSTS)
            rows.append({"schedule": name, "memory_limit": "", "m": m, "makespan": r.makespan,
                         "bubble": r.bubble, "span_bubble": r.span_bubble,
                         "peak_micro_batches": r.peak_micro_batches})
    for limit in (P / 2, P, 1.5 * P, 2 * P):
        for m in (16, 32):
            s, info = baton.auto_schedule(P, m, COSTS, memory_limit=limit)
            rows.append({"schedule": "auto", "memory_limit": limit, "m": m,
                         "makespan": info["makespan"], "bubble": info["bubble"],
                         "span_bubble": info["span_bubble"],
                         "peak_micro_batches": info["peak_micro_batches"]})
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}.csv ({len(rows)} rows)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in baton.schedule_names():
        pts = [r for r in rows if r["schedule"] == name]
        if pts:
            a.plot([r["m"] for r in pts], [r["bubble"] for r in pts], marker="o", label=name)
            b.scatter([r["peak_micro_batches"] for r in pts], [r["bubble"] for r in pts],
                      label=name)
    a.set_xlabel("micro-batches m")
    a.set_ylabel("bubble")
    b.set_xlabel("peak activation memory (micro-batches)")
    b.set_ylabel("bubble")
    a.legend(fontsize=7)
    fig.suptitle(f"p = {P}, F/B/W = 1/1.2/0.8")
    fig.savefig(out + ".png", dpi=120)
    print(f"wrote {out}.png")


if __name__ == "__main__":
    main(*sys.argv[1:])
