#!/usr/bin/env bash
# Sets up, checks the formatting (seconds), then builds and runs the whole test suite:
# the release build (every test; before its tests, clang-tidy on the C++ files changed
# since .ci/tidy-base), then the sanitizer builds on the tests labelled for
# them (asan: bad input, memory and the fuzz targets; tsan: the threaded backends).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's seconds, printed at the end (docs/development.md keeps the figures).
times=()
phase() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  times+=("$name $((SECONDS - t0)) s")
}
phase setup scripts/setup.sh
phase lint scripts/lint.sh --format-only
for preset in release asan tsan; do
  echo "== $preset =="
  phase "$preset build" scripts/build.sh "$preset"
  # clang-tidy on the C++ files changed since .ci/tidy-base (minutes at most).
  if [ "$preset" = release ]; then
    phase tidy scripts/lint.sh --tidy "$(grep -v '^#' .ci/tidy-base | head -n 1)"
  fi
  phase "$preset tests" ctest --preset "$preset"
done
echo "== times: ${times[*]/%/;} total $SECONDS s"
