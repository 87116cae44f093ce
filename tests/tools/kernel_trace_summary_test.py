#!/usr/bin/env python3
"""bench/cuda/kernel_trace_summary.py on a trace written by hand, whose figures are known:
6 steps of [two kernels on two streams that overlap, a gap the host caused, a copy,
AdamW in two launches]; the first 2 steps are left out. Busy time is the union of the
intervals, the idle gaps the spaces between them, the kernels' times per step their sums.
"""
import os
import re
import subprocess
import sys
import tempfile

src = sys.argv[1]
rows = ["kind,stream,start_ns,end_ns,bytes,name"]
t = 0
for step in range(6):
    rows.append(f'kernel,7,{t},{t + 40000},0,"void baton::gemm<float>(int, float*)"')
    rows.append(f'kernel,9,{t + 30000},{t + 50000},0,"void baton::(anonymous namespace)::gelu_k<__nv_bfloat16>(long)"')
    rows.append(f'sync,7,{t + 50000},{t + 140000},0,"stream"')
    rows.append(f'memcpy,7,{t + 150000},{t + 151000},4000000,"DtoH"')  # 100 us idle before it
    rows.append(f'kernel,7,{t + 151000},{t + 156000},0,"void adamw_many_k<__nv_bfloat16, float>(Batch)"')
    rows.append(f'kernel,7,{t + 156000},{t + 160000},0,"void adamw_many_k<__nv_bfloat16, float>(Batch)"')
    t += 170000  # 10 us idle before the next step
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.csv")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    out = subprocess.run([sys.executable, os.path.join(src, "bench/cuda/kernel_trace_summary.py"), path,
                          "--skip", "2", "--gap-us", "50"], capture_output=True, text=True, check=True).stdout


def expect(pattern):
    if not re.search(pattern, out, re.M):
        sys.exit(f"FAIL: no match for {pattern!r} in:\n{out}")


expect(r"^.*: 3 steps after 2")
# Each step: 170 us of wall, busy 50 (the overlapping kernels) + 1 + 9 = 60 us.
expect(r"per step: wall 0\.170 ms, GPU busy 0\.060 ms \(35\.3%\), idle 0\.110 ms in 2 gaps")
expect(r"host synchronizations per step: stream 1\.0 \(0\.090 ms\)")
expect(r"idle gaps of 50 us or more: 1\.0 per step, 0\.100 ms per step")
expect(r"^\s+100\.0 us\s+after baton::gelu_k<__nv_bfloat16>\s+before DtoH")
expect(r"^baton::gemm<float>\s+1\.0\s+0\.040\s+66\.7%")
expect(r"^adamw_many_k<__nv_bfloat16, float>\s+2\.0\s+0\.009\s+15\.0%")
expect(r"^\[memcpy DtoH\]\s+1\.0\s+0\.001\s+1\.7%\s+4000 GB/s")
print("ok")
