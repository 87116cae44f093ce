#!/usr/bin/env bash
# Sets up, checks the formatting (seconds), then builds and runs the whole test suite:
# the release build (every test; before its tests, clang-tidy on the C++ files changed
# since .ci/tidy-base), then the sanitizer builds on the tests labelled for
# them (asan: bad input, memory and the fuzz targets; tsan: the threaded backends).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/lint.sh --format-only
for preset in release asan tsan; do
  echo "== $preset =="
  scripts/build.sh "$preset"
  # clang-tidy on the C++ files changed since .ci/tidy-base (minutes at most).
  [ "$preset" != release ] || scripts/lint.sh --tidy "$(grep -v '^#' .ci/tidy-base | head -n 1)"
  ctest --preset "$preset"
done
