#!/usr/bin/env bash
# Builds the libFuzzer targets (the asan preset: clang 14, ASan + UBSan) and fuzzes each
# for SECONDS (default 60), one after another. Each grows its corpus in
# build/asan/fuzz-corpus/<target>/ from the seeds in tests/fuzz/corpus/<target>/ (left as
# they are); its log, with libFuzzer's final stats, goes to build/asan/fuzz-<target>.log.
# A crash leaves its input in build/asan/fuzz-artifacts/: fix the parser and add the
# input to tests/fuzz/corpus/<target>/ as a regression test. BATON_FUZZ_BUILD=DIR uses
# another build folder configured with BATON_FUZZ=ON.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 600 safetensors plan
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
out="${BATON_FUZZ_BUILD:-build/asan}"
if [ -z "${BATON_FUZZ_BUILD:-}" ]; then cmake --preset asan >/dev/null || exit 1; fi
cmake --build "$out" -j2 --target "${targets[@]/#/fuzz_}" || exit 1
mkdir -p "$out/fuzz-artifacts"
failed=()
printf '%-16s %8s %8s %8s %8s  %s\n' target seconds execs cov corpus result
for t in "${targets[@]}"; do
  mkdir -p "$out/fuzz-corpus/$t"
  log="$out/fuzz-$t.log"
  "$out/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/fuzz-artifacts/$t-" \
    "$out/fuzz-corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
  corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$done_line")
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log")
  result=ok
  if [ $rc -ne 0 ]; then result="FAILED (rc $rc, see $log)"; failed+=("$t"); fi
  printf '%-16s %8s %8s %8s %8s  %s\n' "$t" "$seconds" "${execs:-?}" "${cov:-?}" "${corp:-?}" "$result"
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: findings in ${failed[*]}: inputs in $out/fuzz-artifacts/"
  exit 1
fi
