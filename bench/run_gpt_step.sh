#!/usr/bin/env bash
# Runs baton's GPT training step (bench_gpt_step) and PyTorch's (pytorch_gpt_step.py) on
# the same configs and thread counts in one go and prints one table.
#   bench/run_gpt_step.sh [--steps N] [--compile] [--family gpt|llama]   (from the repository root)
# --family llama: LLaMA-style configs against transformers' LlamaForCausalLM, and greedy
# generation tokens/s of config B (baton generate against transformers' generate, the
# same weights, 16 prompt tokens, 128 new).
# Needs build/release/bench/bench_gpt_step and a Python with torch (.venv/bin/python by
# default, PYTHON=... to choose; python3 -m venv .venv && .venv/bin/pip install torch).
# OpenBLAS's core type is left as the environment sets it; PyTorch runs with the tuned
# malloc settings of docs/benchmarks.md. A command that fails ends the script with its
# command, output and a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=10
compile=""
family=gpt
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --compile) compile="--compile"; shift ;;
    --family) need_value "$1" $#; family="$2"; shift 2 ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
need_int --steps "$steps" 1
case "$family" in
  gpt|llama) ;;
  *) echo "--family: expected gpt or llama, found '$family'" >&2; exit 2 ;;
esac
python="${PYTHON:-.venv/bin/python}"
# On CPUs with AVX-512 that OpenBLAS 0.3.21 does not recognise (VMs that mask CPUID),
# its autodetection falls back to Prescott kernels, several times slower: name the core.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
bench=build/release/bench/bench_gpt_step
[ -x "$bench" ] || { echo "build $bench first: cmake --build --preset release --target bench_gpt_step" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "$python has no torch (see the header of this script)" >&2; exit 2; }
baton=build/release/baton
if [ "$family" = llama ]; then
  [ -x "$baton" ] || { echo "build $baton first for the generation figures" >&2; exit 2; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-autodetect}"
run_logged "$tmp/baton.txt" "$bench" --family "$family" --steps "$steps"
tunables=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=1073741824
run_logged "$tmp/torch.txt" env "$tunables" "$python" bench/pytorch_gpt_step.py --family "$family" \
  --steps "$steps"
if [ -n "$compile" ]; then
  run_logged "$tmp/torch-compile.txt" env "$tunables" "$python" bench/pytorch_gpt_step.py \
    --family "$family" --steps "$steps" --compile
  cat "$tmp/torch-compile.txt" >> "$tmp/torch.txt"
fi
grep '^#' "$tmp/torch.txt" | head -1 || true
printf "%-6s %7s | %9s %9s %7s %6s | %9s %9s %s\n" config threads "baton t/s" "GFLOP/s" "sgemm" "of it" "torch t/s" "GFLOP/s" "baton/best torch"
grep -E '^[AB] ' "$tmp/baton.txt" | while read -r cfg thr ms mn mx toks gf sg frac; do
  best=$(awk -v c="$cfg" -v t="$thr" '$1=="torch" && $2==c && $3==t {print $7, $8}' "$tmp/torch.txt" | sort -n -k1 | tail -1)
  ttoks=${best% *}
  tgf=${best#* }
  ratio=$(awk -v a="$toks" -v b="$ttoks" 'BEGIN {printf "%.2f", a / b}')
  printf "%-6s %7s | %9s %9s %7s %6s | %9s %9s %s\n" "$cfg" "$thr" "$toks" "$gf" "$sg" "$frac" "$ttoks" "$tgf" "$ratio"
done
echo "# baton: median of $steps steps; torch variants measured:"
grep '^torch ' "$tmp/torch.txt" | sed 's/^/#   /'
if [ "$family" = llama ]; then
  echo "# generation, config B, greedy, KV cache: threads, baton tok/s, torch tok/s"
  for thr in 1 2; do
    run_logged "$tmp/gen.txt" "$python" bench/pytorch_gpt_step.py --generate "$tmp/gen" --config B \
      --threads "$thr"
    # Its row (the file holds stderr's warnings too).
    ttoks=$(awk '$1 == "torch-generate" {print $6}' "$tmp/gen.txt")
    run_logged "$tmp/generate.txt" "$baton" generate --init-from "$tmp/gen" \
      --prompt-ids "$(cat "$tmp/gen/prompt_ids.txt")" --max-new-tokens 128 --threads "$thr"
    btoks=$(sed -n 's/.*: \([0-9.]*\) tokens\/s/\1/p' "$tmp/generate.txt")
    echo "generate B $thr $btoks $ttoks"
  done
fi
