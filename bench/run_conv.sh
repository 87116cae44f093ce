#!/usr/bin/env bash
# The convolution benchmarks of docs/benchmarks.md in one go (from the repository root):
#  1. a CIFAR-sized ResNet's training step (baton train, "type": "resnet") against the same
#     network in PyTorch eager (bench/pytorch_resnet_step.py; --compile adds torch.compile),
#     same batch, same threads;
#  2. a large-image ResNet (256x256, 8 channels in, 16 wide: three 3x3 convolutions at full
#     resolution) split spatially over 2 ranks against the same plan on 1 rank, and the
#     part of the halo receives the interior rows hid (bench/halo_hidden.py on --trace);
#  3. the same model under a device memory cap the 1-rank plan exceeds (baton refuses it
#     before running, and the script prints baton's reason), on 2 tiles;
#  4. the same model with the stem's max pooling (3x3, stride 2, padding 1: a halo of one
#     row, computed around like the convolutions') at spatial 2: the halo hidden.
#   bench/run_conv.sh [--steps N] [--threads T] [--compile] [--cap 160MiB]
# Needs build/release/baton and a Python with torch and numpy (PYTHON=..., default .venv/bin/python).
# A command that fails ends the script with its command, output and a non-zero exit.
# KEEP_TMP=1 keeps the working folder (the images img32/ and img256/, the models and plans
# such as big-pool-s2.json, the traces), named at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=10
threads=1
compile=""
cap=160MiB
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --threads) need_value "$1" $#; threads="$2"; shift 2 ;;
    --compile) compile="--compile"; shift ;;
    --cap) need_value "$1" $#; cap="$2"; shift 2 ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
need_int --steps "$steps" 1
need_int --threads "$threads" 1
python="${PYTHON:-.venv/bin/python}"
# Absolute: the spatial runs below work in a scratch directory.
python=$(command -v "$python" || echo "$python")
[[ "$python" == /* ]] || python="$PWD/$python"
baton=$PWD/build/release/baton
[ -x "$baton" ] || { echo "build $baton first: cmake --build --preset release --target baton" >&2; exit 2; }
"$python" -c "import torch, numpy" 2>/dev/null || { echo "$python has no torch or numpy" >&2; exit 2; }

tmp=$(mktemp -d)
if [ -n "${KEEP_TMP:-}" ]; then
  trap 'echo "kept $tmp"' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi
run_logged "$tmp/data.out" "$python" - "$tmp" <<'PY'
import os, sys
import numpy as np
rng = np.random.default_rng(0)
for name, c, h, n in [("img32", 3, 32, 256), ("img256", 8, 256, 32)]:
    os.makedirs(f"{sys.argv[1]}/{name}")
    np.save(f"{sys.argv[1]}/{name}/images.npy", rng.standard_normal((n, c, h, h), dtype=np.float32))
    np.save(f"{sys.argv[1]}/{name}/labels.npy", rng.integers(0, 10, n))
PY
cat > "$tmp/r32.json" <<'JSON'
{"type": "resnet", "name": "resnet-cifar", "in_channels": 3, "image_size": 32, "classes": 10,
 "stem_channels": 16, "stem_kernel": 3, "stem_stride": 1, "stem_pool": false,
 "block": "basic", "widths": [16, 32, 64], "depths": [1, 1, 1]}
JSON
cat > "$tmp/big.json" <<'JSON'
{"type": "resnet", "name": "resnet-big-image", "in_channels": 8, "image_size": 256, "classes": 10,
 "stem_channels": 16, "stem_kernel": 3, "stem_stride": 1, "stem_pool": false,
 "block": "basic", "widths": [16], "depths": [1]}
JSON
sed 's/"stem_pool": false/"stem_pool": true/; s/resnet-big-image/resnet-big-image-pool/' \
  "$tmp/big.json" > "$tmp/big-pool.json"
cat > "$tmp/big-pool-s2.json" <<JSON
{"version": 1, "model": "big-pool.json", "devices": 2, "parallel": {"dp": 1, "pp": 1},
 "batch": {"micro_batch_size": 4}, "schedule": {"name": "1f1b", "micro_batches": 1},
 "stages": [{"layers": ["stem", "layer1.0", "head"], "spatial": 2}]}
JSON
for s in 1 2; do
  sp=""; [ "$s" = 2 ] && sp=', "spatial": 2'
  cat > "$tmp/big-s$s.json" <<JSON
{"version": 1, "model": "big.json", "devices": $s, "parallel": {"dp": 1, "pp": 1},
 "batch": {"micro_batch_size": 4}, "schedule": {"name": "1f1b", "micro_batches": 1},
 "stages": [{"layers": ["stem", "layer1.0", "head"]$sp}]}
JSON
done
# The median of the progress lines' ms/step, the first step (warm-up) left out; of an even
# count the mean of the middle two, as the other scripts take it.
median_ms() { grep -o '[0-9.]* ms/step' "$1" | tail -n +2 | awk '{print $1}' | sort -g |
  awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# The steps the --trace-steps 3 runs below trace: their last 3, or all when fewer.
traced=$((steps + 1 < 3 ? steps + 1 : 3))

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), threads per process $threads, $steps steps"
run_logged "$tmp/r32.txt" "$baton" train --model "$tmp/r32.json" --data "$tmp/img32" --batch 32 \
  --steps $((steps + 1)) --threads "$threads" --log-every 1
echo "resnet-cifar batch 32: baton $(median_ms "$tmp/r32.txt") ms/step (median)"
for v in eager ${compile:+compile}; do
  flag=()
  [ "$v" = compile ] && flag=(--compile)
  run_logged "$tmp/torch-$v.txt" "$python" bench/pytorch_resnet_step.py --model "$tmp/r32.json" \
    --batch 32 --threads "$threads" --steps "$steps" "${flag[@]}"
  sed 's/^/resnet-cifar batch 32: /' "$tmp/torch-$v.txt"
done

cd "$tmp"
run_logged s1.txt "$baton" launch -n 1 -- "$baton" train --plan big-s1.json --data img256 \
  --steps $((steps + 1)) --threads "$threads" --log-every 1
run_logged s2.txt "$baton" launch -n 2 -- "$baton" train --plan big-s2.json --data img256 \
  --steps $((steps + 1)) --threads "$threads" --log-every 1 --trace s2-trace.json --trace-steps 3
one=$(median_ms s1.txt)
two=$(median_ms s2.txt)
echo "big image 4x8x256x256: 1 rank $one ms/step, spatial 2 $two ms/step, speed-up $(awk -v a="$one" -v b="$two" 'BEGIN {printf "%.2f", a / b}')"
echo "  peak memory: 1 rank $(grep -o 'peak device memory of rank 0: [0-9.]* MiB' s1.txt | grep -o '[0-9.]* MiB'), spatial 2 $(grep -o 'peak device memory of rank 0: [0-9.]* MiB' s2.txt | grep -o '[0-9.]* MiB') per rank"
echo "  halo (events, halo ms, hidden ms, exposed ms, hidden fraction, step ms; summed over ranks and $traced steps):"
run_logged halo-s2.txt "$python" "$OLDPWD/bench/halo_hidden.py" s2-trace.json
echo "  $(cat halo-s2.txt)"

# The 1-rank plan over the cap: baton refuses it before running ("the plan does not fit in
# ... per device", exit 2), or a run that gets past that check runs out of memory; either
# is the expected result, said with baton's reason. Anything else (a typo in --cap) fails.
c1=("$baton" launch -n 1 -- "$baton" train --plan big-s1.json --data img256 --steps 2
    --threads "$threads" --device-memory "$cap")
rc=0
"${c1[@]}" > c1.txt 2>&1 || rc=$?
if [ "$rc" = 0 ]; then
  echo "capped $cap: 1 rank fits (raise the model or lower --cap)"
elif reason=$(grep -o 'the plan does not fit in [^;]*' c1.txt | head -1) && [ -n "$reason" ]; then
  [[ "$reason" != *"("* ]] || reason+=")"  # its parenthesis closes after the ';'
  echo "capped $cap: 1 rank refused before running: $reason"
elif reason=$(grep -o 'out of memory[^;]*' c1.txt | head -1) && [ -n "$reason" ]; then
  echo "capped $cap: 1 rank ran out of memory: $reason"
else
  fail_with_output c1.txt "$rc" "${c1[@]}"
fi
run_logged c2.txt "$baton" launch -n 2 -- "$baton" train --plan big-s2.json --data img256 \
  --steps "$steps" --threads "$threads" --device-memory "$cap" --log-every "$steps"
echo "capped $cap: spatial 2: $(grep -o 'loss [0-9.]*' c2.txt | tail -1), $(grep -o '[0-9.]* ms/step' c2.txt | tail -1), $(grep -o 'peak device memory of rank 0: [0-9.]* MiB' c2.txt)"

run_logged p2.txt "$baton" launch -n 2 -- "$baton" train --plan big-pool-s2.json --data img256 \
  --steps $((steps + 1)) --threads "$threads" --log-every 1 --trace p2-trace.json --trace-steps 3
echo "big image with the stem's max pooling, spatial 2: $(median_ms p2.txt) ms/step; halo (as above):"
run_logged halo-p2.txt "$python" "$OLDPWD/bench/halo_hidden.py" p2-trace.json
echo "  $(cat halo-p2.txt)"
