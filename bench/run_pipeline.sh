#!/usr/bin/env bash
# The engine's pipeline benchmark (docs/benchmarks.md, "Pipeline parallelism"): GPT
# config B, 8 micro-batches of 1 sample, 1F1B, on this 2-core machine:
#   1. one process, one thread (8 micro-batches; and 1 micro-batch of 8 for reference)
#   2. PP=2: two processes (baton launch, UCX), one thread each
#   3. the simulator's prediction of both from the op costs `baton profile` measures (alone,
#      and with two ranks on the host: --colocated 2)
#   4. torch.distributed.pipelining over gloo, same model, cut, schedule, micro-batches
# in one run, and prints one table (median, min, max after warm-up).
#   bench/run_pipeline.sh [--steps N] [--warmup W] [--schedule S]
#                         [--optimizer-step synchronous|post-validated] [--no-peer]
#   (any generator; the torch peer runs for 1f1b and gpipe; --no-peer leaves it out)
# Needs build/release/baton and a Python with torch (.venv/bin/python by default,
# PYTHON=... to choose; python3 -m venv .venv && .venv/bin/pip install torch). A command
# that fails, the torch peer's too, ends the script with its output and a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=5
warmup=2
schedule=1f1b
optimizer_step=synchronous
peer=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --warmup) need_value "$1" $#; warmup="$2"; shift 2 ;;
    --schedule) need_value "$1" $#; schedule="$2"; shift 2 ;;
    --optimizer-step) need_value "$1" $#; optimizer_step="$2"; shift 2 ;;
    --no-peer) peer=""; shift ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
need_int --steps "$steps" 1
need_int --warmup "$warmup" 0
# Checked here, not by the PP=2 run after a minute of single-process runs.
case "$optimizer_step" in
  synchronous|post-validated) ;;
  *) echo "--optimizer-step: expected synchronous or post-validated, found '$optimizer_step'" >&2; exit 2 ;;
esac
python="${PYTHON:-.venv/bin/python}"
baton=build/release/baton
[ -x "$baton" ] || { echo "build $baton first" >&2; exit 2; }
if [ -n "$peer" ] && { [ "$schedule" = 1f1b ] || [ "$schedule" = gpipe ]; } &&
   ! "$python" -c "import torch.distributed.pipelining" 2>/dev/null; then
  echo "$python has no torch.distributed.pipelining for the peer: install torch (see the header of this script), or pass --no-peer" >&2
  exit 2
fi
# OpenBLAS 0.3.21 misdetects AVX-512 CPUs in VMs that mask CPUID and falls back to its
# slow SSE3 kernels: name the core type (docs/kernels.md).
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=examples/models/gpt-config-b.json
data=examples/data/licenses.txt
total=$((steps + warmup))
cp "$model" "$tmp/model.json"
cat > "$tmp/pp2.json" <<JSON
{"version": 1, "model": "model.json", "devices": 2,
 "parallel": {"dp": 1, "pp": 2, "tp": 1},
 "batch": {"micro_batch_size": 1, "global": 8},
 "schedule": {"name": "$schedule", "micro_batches": 8},
 "optimizer_step": "$optimizer_step",
 "stages": [{"layers": [0, 5]}, {"layers": [5, 10]}]}
JSON
cat > "$tmp/pp1.json" <<JSON
{"version": 1, "model": "model.json", "devices": 1,
 "parallel": {"dp": 1, "pp": 1, "tp": 1},
 "batch": {"micro_batch_size": 1, "global": 8},
 "schedule": {"name": "$schedule", "micro_batches": 8},
 "optimizer_step": "$optimizer_step",
 "stages": [{"layers": [0, 10]}]}
JSON
# The plans checked before the runs: a schedule name that no generator has had failed only
# at the PP=2 run, after a minute of single-process runs.
for p in pp1 pp2; do run_logged "$tmp/check-$p.out" "$baton" plan --check "$tmp/$p.json"; done

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-autodetect}"
echo "# GPT config B ($model), batch 8 x 256 tokens, 8 micro-batches, $schedule, $optimizer_step step; $warmup warm-up + $steps timed steps"

# Step times (ms) from baton's progress lines, after the warm-up.
step_ms() { grep -o '[0-9.]* ms/step' "$1" | awk '{print $1}' | tail -n "$steps"; }
stats() { sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2; printf "%.1f %.1f %.1f", m, v[1], v[NR]}'; }

# 1. one process, one thread
run_logged "$tmp/one8.out" "$baton" train --model "$tmp/model.json" --data "$data" --steps "$total" \
  --batch 8 --micro-batches 8 --threads 1 --log-every 1
one8=$(step_ms "$tmp/one8.out" | stats)
run_logged "$tmp/one1.out" "$baton" train --model "$tmp/model.json" --data "$data" --steps "$total" \
  --batch 8 --micro-batches 1 --threads 1 --log-every 1
one1=$(step_ms "$tmp/one1.out" | stats)

# 2. PP=2, two processes with one thread each; the last step's timeline
run_logged "$tmp/pp2.out" "$baton" launch -n 2 -- "$baton" train --plan "$tmp/pp2.json" --data "$data" \
  --steps "$total" --threads 1 --log-every 1 --trace "$tmp/measured.json"
pp2=$(grep '^\[rank 0\]' "$tmp/pp2.out" > "$tmp/pp2.rank0"; step_ms "$tmp/pp2.rank0" | stats)

# 3. the prediction from measured op costs (micro-batch of 1 sample, one thread; and
#    beside a second copy, as PP=2's two ranks share the host)
run_logged "$tmp/profile.out" "$baton" profile --model "$tmp/model.json" --batch 1 --threads 1 \
  --colocated 2 -o "$tmp/profile.json"
grep 'ranks on the host' "$tmp/profile.out" | sed 's/^/# /' || true
# The step time `baton trace predict ARGS...` prints.
predict() {
  run_logged "$tmp/predict.out" "$baton" trace predict "$@"
  grep -o 'step time [0-9.]*' "$tmp/predict.out" | awk '{print $3}'
}
pred2=$(predict --plan "$tmp/pp2.json" --costs "$tmp/profile.json" -o "$tmp/predicted.json")
pred1=$(predict --plan "$tmp/pp1.json" --costs "$tmp/profile.json")
pred2_alone=$(predict --plan "$tmp/pp2.json" --costs "$tmp/profile.json" --ranks-per-host 1)

# 4. torch.distributed.pipelining over gloo
# A failing peer had been skipped with "|| true" and exit 0: it is an error now, as a
# missing torch is (checked above); --no-peer leaves the peer out on purpose.
torch_line=""
if [ -z "$peer" ]; then
  echo "# no torch peer (--no-peer)"
elif [ "$schedule" != 1f1b ] && [ "$schedule" != gpipe ]; then
  echo "# no torch peer for $schedule (bench/torch_pipeline.py runs 1f1b and gpipe)"
else
  run_logged "$tmp/torch.out" env \
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=1073741824 \
    "$python" bench/torch_pipeline.py --schedule "$schedule" --steps "$steps" --warmup "$warmup"
  grep '^#' "$tmp/torch.out" || true
  torch_line=$(grep '^torch-pipelining' "$tmp/torch.out" | awk '{print $3, $4, $5}' || true)
  [ -n "$torch_line" ] || fail_with_output "$tmp/torch.out" 1 "$python" bench/torch_pipeline.py \
    --schedule "$schedule" --steps "$steps" --warmup "$warmup" "(no torch-pipelining row)"
fi

tokens=2048
printf '\n| run | median ms | min | max | tokens/s |\n|---|---|---|---|---|\n'
row() { local name="$1"; set -- $2; printf '| %s | %s | %s | %s | %.0f |\n' "$name" "$1" "$2" "$3" "$(echo "$tokens / $1 * 1000" | bc -l)"; }
row "baton, 1 process x 1 thread, 8 micro-batches" "$one8"
row "baton, 1 process x 1 thread, 1 micro-batch of 8" "$one1"
row "baton, PP=2 (2 processes x 1 thread, UCX)" "$pp2"
[ -n "$torch_line" ] && row "torch.distributed.pipelining, PP=2 (gloo, 2 x 1 thread)" "$torch_line"
m1=$(echo "$one8" | awk '{print $1}'); m2=$(echo "$pp2" | awk '{print $1}')
echo
echo "predicted (simulator, measured op costs): 1 process $(printf %.1f "$pred1") ms, PP=2 $(printf %.1f "$pred2") ms"
echo "speedup PP=2 over 1 process (8 micro-batches): measured $(echo "$m1 / $m2" | bc -l | xargs printf %.3f), predicted $(echo "$pred1 / $pred2" | bc -l | xargs printf %.3f) (measured / predicted: $(echo "($m1 / $m2) / ($pred1 / $pred2)" | bc -l | xargs printf %.3f))"
echo "PP=2 step: measured / predicted = $(echo "$m2 / $pred2" | bc -l | xargs printf %.3f) (without the co-location slowdown: predicted $(printf %.1f "$pred2_alone") ms, measured / predicted $(echo "$m2 / $pred2_alone" | bc -l | xargs printf %.3f))"
echo "1 process step: measured / predicted = $(echo "$m1 / $pred1" | bc -l | xargs printf %.3f)"
if [ -n "$torch_line" ]; then
  t=$(echo "$torch_line" | awk '{print $1}')
  echo "baton PP=2 vs torch pipelining: $(echo "$t / $m2" | bc -l | xargs printf %.2f)x the peer's speed (above 1: baton faster)"
fi
echo
run_logged "$tmp/compare.out" "$baton" trace compare "$tmp/measured.json" "$tmp/predicted.json"
cat "$tmp/compare.out"
