#!/usr/bin/env bash
# Step-time prediction for a convolutional network's plans (docs/benchmarks.md, "A
# ResNet's spatial plans, predicted"): a 64 x 64 ResNet (3 channels in, stem 32, basic
# blocks of widths 32, 64, 128, one each; random images, 10 classes), micro-batches of 2
# images, a global batch of 16, 1F1B, one thread per rank, all ranks on this host. In one
# run: `baton profile --colocated 2 4 --spatial 2` (the ops, the co-located slowdown, a
# spatial tile's exchanges among 2 and 4 ranks), then per plan the prediction with the
# measured exchanges and without them (the cost file less `spatial_exchange`) against the
# measured step (the median after warm-up).
#   bench/run_conv_prediction.sh [--steps N] [--warmup W] [--plans "pp1 pp2 dp2 sp2 pp2sp2"]
# Needs build/release/baton and a Python with numpy (PYTHON=..., default .venv/bin/python).
# KEEP_TMP=1 keeps the working folder. A plan whose run fails is reported (its command and
# output) and the others go on; the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=8
warmup=4
plans="pp1 pp2 dp2 sp2 pp2sp2"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --warmup) need_value "$1" $#; warmup="$2"; shift 2 ;;
    --plans) need_value "$1" $#; plans="$2"; shift 2 ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
need_int --steps "$steps" 1
need_int --warmup "$warmup" 0
need_plans "pp1 pp2 dp2 sp2 pp2sp2" "$plans"
python="${PYTHON:-.venv/bin/python}"
baton=build/release/baton
[ -x "$baton" ] || { echo "build $baton first" >&2; exit 2; }
"$python" -c "import numpy" 2>/dev/null || { echo "$python has no numpy" >&2; exit 2; }
tmp=$(mktemp -d)
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
run_logged "$tmp/data.out" "$python" - "$tmp/data" <<'PY'
import os, sys
import numpy as np
os.makedirs(sys.argv[1])
r = np.random.default_rng(0)
np.save(os.path.join(sys.argv[1], "images.npy"), r.standard_normal((512, 3, 64, 64)).astype(np.float32))
np.save(os.path.join(sys.argv[1], "labels.npy"), r.integers(0, 10, 512).astype(np.int32))
PY
cat > "$tmp/model.json" <<'JSON'
{"type": "resnet", "name": "resnet-64", "in_channels": 3, "image_size": 64, "classes": 10,
 "stem_channels": 32, "stem_kernel": 3, "stem_stride": 1, "stem_pool": false, "block": "basic",
 "widths": [32, 64, 128], "depths": [1, 1, 1], "strides": [1, 2, 2]}
JSON
plan() {  # name devices dp pp micro_batches stages-json
  cat > "$tmp/$1.json" <<JSON
{"version": 1, "model": "model.json", "devices": $2,
 "parallel": {"dp": $3, "pp": $4},
 "batch": {"micro_batch_size": 2, "global": 16},
 "schedule": {"name": "1f1b", "micro_batches": $5},
 "stages": $6}
JSON
}
plan pp1 1 1 1 8 '[{"layers": [0, 5]}]'
plan pp2 2 1 2 8 '[{"layers": [0, 3]}, {"layers": [3, 5]}]'
plan dp2 2 2 1 4 '[{"layers": [0, 5]}]'
plan sp2 2 1 1 8 '[{"layers": [0, 5], "spatial": 2}]'
plan pp2sp2 4 1 2 8 '[{"layers": [0, 3], "spatial": 2}, {"layers": [3, 5], "spatial": 2}]'
devices() { grep -o '"devices": [0-9]*' "$tmp/$1.json" | awk '{print $2}'; }

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# ResNet 64x64, global batch 16 in micro-batches of 2, 1F1B; $warmup warm-up + $steps timed steps"
run_logged "$tmp/profile.out" "$baton" profile --model "$tmp/model.json" --batch 2 --threads 1 \
  --colocated 2 4 --spatial 2 -o "$tmp/profile.json"
grep -E "ranks on the host|whole training passes" "$tmp/profile.out" | sed 's/^/# /' || true
run_logged "$tmp/without.out" "$python" -c 'import json, sys; c = json.load(open(sys.argv[1])); c.pop("spatial_exchange", None)
json.dump(c, open(sys.argv[2], "w"))' "$tmp/profile.json" "$tmp/profile-without.json"

total=$((steps + warmup))
step_ms() { grep '^\[rank 0\]' "$1" | grep -o '[0-9.]* ms/step' | awk '{print $1}' | tail -n "$steps"; }
median() { sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
predict() {
  run_logged "$tmp/predict.out" "$baton" trace predict --plan "$tmp/$1.json" --costs "$2"
  grep -o 'step time [0-9.]*' "$tmp/predict.out" | awk '{print $3}'
}
failed=""
printf '\n| plan | ranks | predicted ms | without spatial_exchange | measured ms (median) | measured / predicted | measured / without |\n|---|---|---|---|---|---|---|\n'
for p in $plans; do
  n=$(devices "$p")
  cmd=("$baton" launch -n "$n" -- "$baton" train --plan "$tmp/$p.json" --data "$tmp/data"
       --steps "$total" --threads 1 --log-every 1)
  if ! run_row "| $p | $n |" "$tmp/$p.out" "${cmd[@]}"; then
    failed+=" $p"
    continue
  fi
  pred=$(predict "$p" "$tmp/profile.json")
  without=$(predict "$p" "$tmp/profile-without.json")
  meas=$(step_ms "$tmp/$p.out" | median)
  printf '| %s | %s | %.1f | %.1f | %.1f | %.3f | %.3f |\n' "$p" "$n" "$pred" "$without" "$meas" \
    "$(echo "$meas / $pred" | bc -l)" "$(echo "$meas / $without" | bc -l)"
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$failed" ]; then
  echo "failed:$failed (their commands and output above)" >&2
  exit 1
fi
