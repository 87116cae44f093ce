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
# malloc settings of docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=10
compile=""
family=gpt
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --compile) compile="--compile"; shift ;;
    --family) family="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-.venv/bin/python}"
# On CPUs with AVX-512 that OpenBLAS 0.3.21 does not recognise (VMs that mask CPUID),
# its autodetection falls back to Prescott kernels, several times slower: name the core.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
bench=build/release/bench/bench_gpt_step
[ -x "$bench" ] || { echo "build $bench first: cmake --build --preset release --target bench_gpt_step" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "$python has no torch (see the header of this script)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-autodetect}"
"$bench" --family "$family" --steps "$steps" > "$tmp/baton.txt"
GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=1073741824 \
  "$python" bench/pytorch_gpt_step.py --family "$family" --steps "$steps" > "$tmp/torch.txt"
if [ -n "$compile" ]; then
  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=1073741824 \
    "$python" bench/pytorch_gpt_step.py --family "$family" --steps "$steps" --compile >> "$tmp/torch.txt"
fi
grep '^#' "$tmp/torch.txt" | head -1
printf "%-6s %7s | %9s %9s %7s %6s | %9s %9s %s\n" config threads "baton t/s" "GFLOP/s" "sgemm" "of it" "torch t/s" "GFLOP/s" "baton/best torch"
grep -E '^[AB] ' "$tmp/baton.txt" | while read -r cfg thr ms mn mx toks gf sg frac; do
  best=$(awk -v c="$cfg" -v t="$thr" '$1=="torch" && $2==c && $3==t {print $7, $8}' "$tmp/torch.txt" | sort -n -k1 | tail -1)
  ttoks=${best% *}
  tgf=${best#* }
  ratio=$(awk -v a="$toks" -v b="$ttoks" 'BEGIN {printf "%.2f", a / b}')
  printf "%-6s %7s | %9s %9s %7s %6s | %9s %9s %s\n" "$cfg" "$thr" "$toks" "$gf" "$sg" "$frac" "$ttoks" "$tgf" "$ratio"
done
echo "# baton: median of $steps steps; torch variants measured:"
grep -v '^#' "$tmp/torch.txt" | sed 's/^/#   /'
if [ "$family" = llama ]; then
  baton=build/release/baton
  [ -x "$baton" ] || { echo "build $baton first for the generation figures" >&2; exit 2; }
  echo "# generation, config B, greedy, KV cache: threads, baton tok/s, torch tok/s"
  for thr in 1 2; do
    "$python" bench/pytorch_gpt_step.py --generate "$tmp/gen" --config B --threads "$thr" 2>/dev/null > "$tmp/gen.txt"
    ttoks=$(awk '{print $6}' "$tmp/gen.txt")
    btoks=$("$baton" generate --init-from "$tmp/gen" --prompt-ids "$(cat "$tmp/gen/prompt_ids.txt")" \
      --max-new-tokens 128 --threads "$thr" 2>&1 >/dev/null | sed -n 's/.*: \([0-9.]*\) tokens\/s/\1/p')
    echo "generate B $thr $btoks $ttoks"
  done
fi
