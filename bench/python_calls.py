#!/usr/bin/env python3
"""The Python module's call times against the C++ library's, in the same run.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_calls.py [build/release] [--wall]

For ZB-V at p = 128 ranks and m = 1024 micro-batches (1.8 million lowered actions), on
bench_simulate's costs: the generate + lower + build + run path from Python
(baton.generate, baton.lower, baton.simulate) against bench_simulate's end-to-end figure
for the same schedule, and baton.simulate alone on the lowered schedule against
bench_simulate's build + run, then with its per-action start and end arrays read (built
on first read); then 1,000 simulations of p = 8, m = 32 (a sweep's inner loop), with a
Simulator built once and with baton.simulate each time. Medians of 5 (min, max), by the
process's CPU time unless --wall; the two calls are single-threaded, so on a quiet
machine the clocks agree. Three rounds, Python and C++ alternated.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import baton

# argparse: an unknown flag (--wal) had been ignored silently.
ap = argparse.ArgumentParser(description="The Python module's call times against the C++ library's.",
                             allow_abbrev=False)
ap.add_argument("build", nargs="?", default="build/release",
                help="the build folder holding bench/bench_simulate (default build/release)")
# --wall: the wall clock (a quiet machine); by default the process's CPU time, on both
# sides, which leaves out the time other processes held the cores of a shared machine.
ap.add_argument("--wall", action="store_true", help="time by the wall clock, not CPU time")
opts = ap.parse_args()
build = opts.build
cpu_time = not opts.wall
rounds = 3
clock = time.process_time if cpu_time else time.perf_counter


def timed(f, reps=5):
    f()  # warm-up, as bench_simulate does
    ms = []
    for _ in range(reps):
        t0 = clock()
        f()
        ms.append(1e3 * (clock() - t0))
    return statistics.median(ms), min(ms), max(ms)


def show(what, t):
    print(f"{what:<58} {t[0]:9.1f} ms  [{t[1]:.1f}, {t[2]:.1f}]")


print(f"# machine: {os.cpu_count()} cores, load {' '.join(open('/proc/loadavg').read().split()[:3])}")
print(f"# clock: {'process CPU time' if cpu_time else 'wall clock'}; {rounds} rounds, "
      "Python and C++ alternated")
# bench_simulate's costs (bench/bench_simulate.cpp).
costs = {"forward": 1.0, "backward_input": 1.2, "backward_weight": 0.8,
         "message_bytes": 1048576, "activation_bytes": 1e8,
         "p2p": {"latency": 1e-5, "bandwidth": 1e10}}


def python_round():
    e2e = timed(lambda: baton.simulate(baton.lower(baton.generate("zb-v", 128, 1024)), costs))
    show("Python: simulate(lower(generate('zb-v', 128, 1024)))", e2e)
    lowered = baton.lower(baton.generate("zb-v", 128, 1024))
    alone = timed(lambda: baton.simulate(lowered, costs))
    show("Python: simulate(lowered) (build + run)", alone)

    def with_arrays():
        r = baton.simulate(lowered, costs)
        return r.start, r.end

    show("Python: simulate(lowered), then its start and end arrays", timed(with_arrays))
    return e2e, alone


def cpp_round():
    argv = [os.path.join(build, "bench", "bench_simulate"), "128", "1024", "5"]
    out = subprocess.run(argv + (["--cpu-time"] if cpu_time else []),
                         capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("zb-v "))
    cells = re.findall(r"([\d.]+) \[\s*([\d.]+),\s*([\d.]+)\]", row)
    e2e = tuple(float(x) for x in cells[-1])
    build_run = tuple(float(a) + float(b) for a, b in zip(cells[2], cells[3]))
    show("C++: bench_simulate zb-v 128 1024, end to end", e2e)
    show("C++: bench_simulate zb-v 128 1024, build + run", build_run)
    return e2e, build_run


for k in range(rounds):
    print(f"## round {k + 1}")
    py_all, py = python_round()
    end_to_end, build_run = cpp_round()
    print(f"Python / C++, end to end: {py_all[0] / end_to_end[0]:.3f}; "
          f"simulate alone: {py[0] / build_run[0]:.3f} (medians)")

s = baton.generate("zb-h1", 8, 32)
costs = {"forward": 1.0, "backward_input": 1.0, "backward_weight": 1.0}
sim = baton.Simulator(s)


def reused():
    for _ in range(1000):
        sim.run(costs)


def fresh():
    for _ in range(1000):
        baton.simulate(s, costs)


show("1,000 x Simulator(zb-h1 p=8 m=32).run(costs)", timed(reused))
show("1,000 x simulate(zb-h1 p=8 m=32, costs)", timed(fresh))
