#!/usr/bin/env bash
# Step-time prediction against measurement (docs/benchmarks.md, "Step-time prediction"):
# GPT config A (4 blocks, n_embd 256, context 128) on one process (the peer), at PP2 x DP1 (1F1B, 8 micro-batches),
# PP1 x DP2 and PP2 x TP2 x DP2 (1F1B, 4 micro-batches per replica), TP2 (8), PP2 x DP4
# (2 per replica; 8 ranks without tensor parallelism), micro-batches of 2
# sequences, a global batch of 16, one thread per rank, all ranks on this host
# (`baton launch`). In one run per plan: the op costs `baton profile` measures, alone
# and beside copies of itself (--colocated: as many ranks as the plans have), a TP=2
# shard's ops and its collectives among that many ranks (--tp 2), the
# simulator's prediction from them (`baton trace predict`) and the measured step
# (`baton train --plan`, median after warm-up), and `baton trace compare` of the last
# step per action kind.
#   bench/run_prediction.sh [--steps N] [--warmup W] [--plans "pp1 pp2 dp2 tp2 pp2tp2dp2 pp2dp4"]
# KEEP_TMP=1 keeps the working folder (plans, profile, every rank's measured trace). A
# plan whose run fails is reported (its command and output) and the others go on; the
# script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=5
warmup=2
plans="pp1 pp2 dp2 tp2 pp2tp2dp2 pp2dp4"
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
need_plans "pp1 pp2 dp2 tp2 pp2tp2dp2 pp2dp4" "$plans"
baton=build/release/baton
[ -x "$baton" ] || { echo "build $baton first" >&2; exit 2; }
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX  # docs/kernels.md
fi
tmp=$(mktemp -d)
[ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
data=examples/data/licenses.txt
total=$((steps + warmup))
cp examples/models/gpt-config-a.json "$tmp/model.json"
plan() {  # name devices dp pp tp micro_batches stages-json
  cat > "$tmp/$1.json" <<JSON
{"version": 1, "model": "model.json", "devices": $2,
 "parallel": {"dp": $3, "pp": $4, "tp": $5},
 "batch": {"micro_batch_size": 2, "global": 16},
 "schedule": {"name": "1f1b", "micro_batches": $6},
 "stages": $7}
JSON
}
plan pp1 1 1 1 1 8 '[{"layers": [0, 6]}]'
plan pp2 2 1 2 1 8 '[{"layers": [0, 3]}, {"layers": [3, 6]}]'
plan dp2 2 2 1 1 4 '[{"layers": [0, 6]}]'
plan tp2 2 1 1 2 8 '[{"layers": [0, 6]}]'
plan pp2tp2dp2 8 2 2 2 4 '[{"layers": [0, 3]}, {"layers": [3, 6]}]'
plan pp2dp4 8 4 2 1 2 '[{"layers": [0, 3]}, {"layers": [3, 6]}]'
# The plans checked before anything runs (each names what is wrong, if anything).
for p in $plans; do run_logged "$tmp/check-$p.out" "$baton" plan --check "$tmp/$p.json"; done
devices() { grep -o '"devices": [0-9]*' "$tmp/$1.json" | awk '{print $2}'; }
tp_of() { grep -o '"tp": [0-9]*' "$tmp/$1.json" | awk '{print $2}'; }

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-autodetect}"
echo "# GPT config A, global batch 16 x 128 tokens, micro-batches of 2, 1F1B; $warmup warm-up + $steps timed steps"
# --colocated with the plans' rank counts above 1 and --tp 2 for the plans that split
# tensors; neither for pp1 alone (an empty --colocated had been refused).
ks=$(for p in $plans; do devices "$p"; done | sort -nu | awk '$1 > 1' | xargs)
profile_args=()
[ -z "$ks" ] || profile_args+=(--colocated $ks)
for p in $plans; do
  if [ "$(tp_of "$p")" -gt 1 ]; then profile_args+=(--tp 2); break; fi
done
run_logged "$tmp/profile.out" "$baton" profile --model "$tmp/model.json" --batch 2 --threads 1 \
  "${profile_args[@]}" -o "$tmp/profile.json"
grep -E "ranks on the host|whole training passes" "$tmp/profile.out" | sed 's/^/# /' || true

step_ms() { grep '^\[rank 0\]' "$1" | grep -o '[0-9.]* ms/step' | awk '{print $1}' | tail -n "$steps"; }
median() { sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
printf '\n| plan | ranks | predicted ms | predicted, ranks alone | measured ms (median) | measured / predicted | measured / predicted alone |\n|---|---|---|---|---|---|---|\n'
# The step time `baton trace predict ARGS...` prints.
predict() {
  run_logged "$tmp/predict.out" "$baton" trace predict "$@"
  grep -o 'step time [0-9.]*' "$tmp/predict.out" | awk '{print $3}'
}
failed=""
for p in $plans; do
  n=$(devices "$p")
  cmd=("$baton" launch -n "$n" -- "$baton" train --plan "$tmp/$p.json" --data "$data" --steps "$total"
       --threads 1 --log-every 1 --trace "$tmp/$p.measured.json")
  if ! run_row "| $p | $n |" "$tmp/$p.out" "${cmd[@]}"; then
    failed+=" $p"
    continue
  fi
  pred=$(predict --plan "$tmp/$p.json" --costs "$tmp/profile.json" -o "$tmp/$p.predicted.json")
  # The same without the co-location slowdown (each rank as if alone on the host).
  alone=$(predict --plan "$tmp/$p.json" --costs "$tmp/profile.json" --ranks-per-host 1)
  meas=$(step_ms "$tmp/$p.out" | median)
  printf '| %s | %s | %.1f | %.1f | %.1f | %.3f | %.3f |\n' "$p" "$n" "$pred" "$alone" "$meas" \
    "$(echo "$meas / $pred" | bc -l)" "$(echo "$meas / $alone" | bc -l)"
  run_logged "$tmp/$p.compare" "$baton" trace compare "$tmp/$p.measured.json" "$tmp/$p.predicted.json"
done
for p in $plans; do
  [ -f "$tmp/$p.compare" ] && { echo; echo "## $p"; cat "$tmp/$p.compare"; }
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$failed" ]; then
  echo "failed:$failed (their commands and output above)" >&2
  exit 1
fi
