#!/usr/bin/env python3
"""Runs `baton bench comm` (local and UCX backends) and the Open MPI peer
(bench/mpi_comm_bench) in one go, with the same sizes and timing, and prints one table:
time and bus bandwidth of each, plus the memcpy ceiling measured in the same run.

    bench/comm_compare.py [--build build/release] [--ranks 2] [--ops all_reduce,...]
                          [--min-bytes 8] [--max-bytes 64MiB] [--reps 7] [--rounds 1]

--build defaults to build/release of this repository, wherever the script runs from.
Sizes take baton's units (memory/units.cpp): B; KiB, MiB, GiB, TiB or K, M, G, T (powers
of 1024); KB, MB, GB, TB (powers of 1000); e.g. 64KiB, 1M, "1 KiB", 1.5MB.

Open MPI runs with its best settings here: the shared-memory BTL (vader) with and
without CMA single-copy, malloc tuned to keep its memory (PERFORMANCE.md); the better of
the two is shown for each row. With --rounds R every program runs R times, interleaved,
and the best median of each row is kept (the machine is shared: this filters out the
rounds that were disturbed). The #wrong column sums the wrong elements of every run of
the row (every round and setting), not the fastest run's alone.
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNED_MALLOC = ("glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:"
                "glibc.malloc.top_pad=1073741824")
ROW = re.compile(r"^(?:\[rank 0\] )?(\w+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)")


def run(cmd, env=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if p.returncode != 0:
        sys.stderr.write(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    rows, header = {}, []
    for line in p.stdout.splitlines():
        if line.startswith("#") or line.startswith("[rank 0] #"):
            header.append(line.replace("[rank 0] ", ""))
        m = ROW.match(line)
        if m:
            op, size = m.group(1), int(m.group(2))
            rows[(op, size)] = dict(time=float(m.group(4)), busbw=float(m.group(8)), wrong=int(m.group(9)))
    return rows, header


def best(a, b):
    """Row-wise best (lowest time) of two result sets, with the wrong counts of both summed:
    a wrong result in a slower round or setting must not drop out of the table."""
    out = dict(a)
    for k, v in b.items():
        if k not in out:
            out[k] = dict(v)
        else:
            wrong = out[k]["wrong"] + v["wrong"]
            if v["time"] < out[k]["time"]:
                out[k] = dict(v)
            out[k]["wrong"] = wrong
    return out


# baton's size units (memory/units.cpp, parse_bytes): the same rule, so that a size baton
# takes is taken here, and one it refuses is refused here with its reason.
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
         "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
SIZE = re.compile(r"(\d*)(?:(\.)(\d*))?([eE][+-]?\d+)? *(.*)")


def to_bytes(s):
    """A size as baton reads it; ValueError with the reason otherwise."""
    m = SIZE.fullmatch(s)
    whole, dot, frac, exp, unit = m.groups()
    if not whole and not frac:
        raise ValueError("expected a number with an optional unit, e.g. 512MiB")
    if unit not in UNITS:
        raise ValueError(f"unknown unit '{unit}' (expected B; KiB, MiB, GiB, TiB or K, M, G, T: "
                         "powers of 1024; KB, MB, GB, TB: powers of 1000)")
    if not dot and not exp:
        n = int(whole) * UNITS[unit]
    else:
        n = float(s[:m.start(5)].rstrip()) * UNITS[unit]
        # Only a literal 0 means 0: a size under a byte (or an exponent's underflow) is refused.
        literal_zero = set(whole + (frac or "")) <= {"0"}
        if not literal_zero and n < 1:
            raise ValueError("expected 0 or at least 1 byte")
        n = int(n + 0.5)
    if n >= 1 << 63:
        raise ValueError("expected at most 2^63 - 1 bytes (8 EiB)")
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build", "release"),
                    help="the build folder (default: build/release of this repository)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast,sendrecv")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--reps", default="7")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    sizes = {}
    for flag in ("min_bytes", "max_bytes"):
        text = getattr(args, flag)
        try:
            sizes[flag] = to_bytes(text)
        except ValueError as e:
            ap.error(f"--{flag.replace('_', '-')}: invalid size '{text}': {e}")

    baton = os.path.join(args.build, "baton")
    mpi_bench = os.path.join(args.build, "bench", "mpi_comm_bench")
    # Both programs get the sizes in bytes: the same rows, whatever unit was given.
    common = ["--op", args.ops, "--min-bytes", str(sizes["min_bytes"]),
              "--max-bytes", str(sizes["max_bytes"]), "--reps", args.reps]
    if not os.access(baton, os.X_OK) or subprocess.run(
            [baton, "version"], capture_output=True, text=True).returncode != 0:
        raise SystemExit(f"{baton} does not run: build it first (or name the build with --build)")
    mpi_common = common
    have_mpi = os.path.exists(mpi_bench)
    results = {"local": {}, "ucx": {}, "mpi": {}}
    headers = {}
    for _ in range(args.rounds):
        r, h = run([baton, "bench", "comm", "--backend", "local", "-n", str(args.ranks)] + common)
        results["local"] = best(results["local"], r)
        headers["local"] = h
        r, h = run([baton, "launch", "-n", str(args.ranks), "--", baton, "bench", "comm", "--backend", "ucx"] + common)
        results["ucx"] = best(results["ucx"], r)
        headers["ucx"] = h
        if have_mpi:
            for copy in ("none", "cma"):
                r, h = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(args.ranks),
                            "--mca", "pml", "ob1", "--mca", "btl", "vader,self",
                            "--mca", "btl_vader_single_copy_mechanism", copy, mpi_bench] + mpi_common,
                           env={"GLIBC_TUNABLES": TUNED_MALLOC})
                results["mpi"] = best(results["mpi"], r)
                headers["mpi"] = h

    for name in ("local", "ucx", "mpi"):
        for line in headers.get(name, []):
            print(f"# [{name}] {line.lstrip('# ')}")
    print(f"# {args.ranks} ranks, best of {args.rounds} round(s); time in us (median of the batches), busbw in GB/s")
    cols = ["local", "ucx"] + (["mpi"] if have_mpi else [])
    head = f"{'op':<15} {'size(B)':>10}" + "".join(f" {c + ' us':>11} {c + ' busbw':>11}" for c in cols)
    if have_mpi:
        head += f" {'ucx/mpi bw':>11}"
    print(head + " #wrong")
    keys = sorted(results["ucx"].keys(), key=lambda k: (args.ops.split(",").index(k[0]), k[1]))
    for k in keys:
        line = f"{k[0]:<15} {k[1]:>10}"
        wrong = 0
        for c in cols:
            v = results[c].get(k)
            if v:
                line += f" {v['time']:>11.2f} {v['busbw']:>11.3f}"
                wrong += v["wrong"]
            else:
                line += f" {'-':>11} {'-':>11}"
        if have_mpi and k in results["mpi"] and results["mpi"][k]["busbw"] > 0:
            line += f" {results['ucx'][k]['busbw'] / results['mpi'][k]['busbw']:>11.2f}"
        print(line + f" {wrong:>6}")


if __name__ == "__main__":
    main()
