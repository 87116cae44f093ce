#!/usr/bin/env bash
# The benchmarks' refusals of bad arguments (ctest bench_arguments): each case exits 2 with
# a message naming what was wrong, before any measuring. They had crashed (SIGSEGV on no
# repetition, an uncaught exception on --threads x), or printed an empty table with exit 0.
#   bench/arguments_test.sh BENCH_DIR
set -uo pipefail
dir="$1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
fails=0
# expect MESSAGE CMD [ARG...]: CMD exits 2 and its output contains MESSAGE.
expect() {
  local want="$1" out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" != 2 ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL: $* (exit $rc, expected 2 and '$want'):"
    echo "$out" | tail -n 5 | sed 's/^/  /'
    fails=$((fails + 1))
  fi
}
expect "--steps: expected at least 1, found 0" "$dir/bench_gpt_step" --steps 0
expect "--steps: expected at least 1, found -1" "$dir/bench_gpt_step" --steps -1
expect "--threads: expected an integer, found 'x'" "$dir/bench_gpt_step" --threads x
expect "--threads: expected at least 1, found 0" "$dir/bench_gpt_step" --threads 0
expect "--threads: expected an integer, found ''" "$dir/bench_gpt_step" --threads 1,,2
expect "--config: expected A, B or all, found 'C'" "$dir/bench_gpt_step" --config C
expect "unrecognised option '--nosuch'" "$dir/bench_gpt_step" --nosuch
expect "repetitions: expected at least 1, found 0" "$dir/bench_simulate" 8 32 0
expect "ranks: expected an integer, found 'x'" "$dir/bench_simulate" x y
expect "unknown option '--cpu-tme'" "$dir/bench_simulate" 8 32 1 --cpu-tme
expect "expected at most 3 numbers" "$dir/bench_simulate" 8 32 1 4
expect "repetitions: expected at least 1, found 0" "$dir/bench_plan" 2 2 0
expect "blocks: expected an integer, found 'x'" "$dir/bench_plan" x
expect "unknown option '--nosuch'" "$dir/bench_plan" --nosuch
expect "--threads: expected at least 1, found 0" "$dir/bench_kernels" --threads 0
expect "--config: expected A, B or all, found 'C'" "$dir/bench_kernels" --config C
expect "--filter 'nosuch': no kernel's name contains it" "$dir/bench_kernels" --config A \
  --threads 1 --min-time 0 --filter nosuch
# --help is help, exit 0 (bench_plan had read it as 0 blocks and aborted).
for b in bench_plan bench_simulate bench_gpt_step bench_kernels; do
  "$dir/$b" --help >/dev/null 2>&1 || { echo "FAIL: $b --help exited $?"; fails=$((fails + 1)); }
done
# The scripts' --help prints the usage of their header, exit 0.
for s in "$repo"/bench/run_*.sh; do
  out=$("$s" --help 2>&1) || { echo "FAIL: $s --help exited $?"; fails=$((fails + 1)); continue; }
  case "$out" in
    *"bench/$(basename "$s")"*) ;;
    *) echo "FAIL: $s --help does not show its usage: $out"; fails=$((fails + 1)) ;;
  esac
done
# The scripts check their arguments before they look for a build or start anything.
expect "--plans: unknown plan 'bogus'" "$repo/bench/run_prediction.sh" --plans bogus
expect "--plans: unknown plan 'bogus'" "$repo/bench/run_conv_prediction.sh" --plans "pp1 bogus"
expect "--optimizer-step: expected synchronous or post-validated, found 'bogus'" \
  "$repo/bench/run_pipeline.sh" --optimizer-step bogus
expect "--only '(': not a valid regular expression" "$repo/bench/run_dp_sync.sh" --only '('
expect "--steps: expected an integer of at least 1, found '0'" "$repo/bench/run_conv.sh" --steps 0
expect "--family: expected gpt or llama, found 'x'" "$repo/bench/run_gpt_step.sh" --family x
expect "--gib: expected a positive size in GiB like 1 or 0.05, found 'abc'" \
  "$repo/bench/run_data.sh" --gib abc
expect "--steps: expected an integer of at least 2, found '1'" "$repo/bench/run_data.sh" --steps 1
expect "invalid size '64kB': unknown unit 'kB'" /usr/bin/python3 "$repo/bench/comm_compare.py" \
  --max-bytes 64kB
[ "$fails" = 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all cases refused as expected"
